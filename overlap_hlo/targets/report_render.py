"""The report of one module compiled before and after the rewrite (`Report`), and how it
is written: the table of sites, the verdict, the JSON and the timeline panels."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from jaxlib.mlir import ir

from overlap_hlo.plan.cost import Hardware
from overlap_hlo.plan.ring_order import Links
from overlap_hlo.rewrite.rewrite_pass import RewritePass
from overlap_hlo.targets.candidates import ORIGINAL
from overlap_hlo.targets.report_rows import SLOWER_TOLERANCE, SiteRow, outside_sites
from overlap_hlo.targets.schedule import Analysis


@dataclass
class Report:
    topology: str
    hardware: str
    clock_ghz: float
    options: dict
    sites: list[SiteRow]
    original: Analysis
    rewritten: Analysis
    original_temp_bytes: int
    rewritten_temp_bytes: int
    module: ir.Module | None = None     # the rewritten module, as compiled
    chosen: str = ""                    # the candidate kept, when the schedule chose
    candidates: dict[str, float] = field(default_factory=dict)   # name -> predicted us
    platform: str = "TPU"
    times: str = ""     # where compute times come from (default: the compiler's cycles)
    requested: str = ""   # the accelerator type the slice was named by ("v5e-8"), if any
    records: list = field(default_factory=list)   # the kept module's `Site` records
    # The options and pipeline that rewrote the kept module (None: the original kept).
    built_with: tuple[dict, str] | None = None

    @property
    def where(self) -> str:
        """The topology as the report names it: "v5e-8 (v5e:2x4)" when asked by type."""
        return f"{self.requested} ({self.topology})" if self.requested else self.topology

    @property
    def original_us(self) -> float:
        return self.original.total_us

    @property
    def rewritten_us(self) -> float:
        return self.rewritten.total_us

    @property
    def compute_bound_us(self) -> float:
        return min(self.original.compute_us, self.rewritten.compute_us)

    @property
    def permutes(self) -> int:
        return len(self.rewritten.permutes)

    @property
    def overlapped(self) -> int:
        return sum(p.overlapped for p in self.rewritten.permutes)

    @property
    def synchronous(self) -> int:
        return sum(p.synchronous for p in self.rewritten.permutes)

    @property
    def times_from(self) -> str:
        return self.times or f"compiler cycles at {self.clock_ghz:g} GHz"

    def to_json(self) -> dict:
        return {
            "topology": self.topology, "requested": self.requested or None,
            "hardware": self.hardware,
            "clock_ghz": self.clock_ghz, "options": {
                key: RewritePass.option_text(key, value)
                if isinstance(value, (Links, Hardware)) else value
                for key, value in self.options.items()},
            "sites": [dict(asdict(row), speedup=row.speedup, slower=row.slower,
                           moved_here=row.moved_here)
                      for row in self.sites],
            "original_us": self.original_us, "rewritten_us": self.rewritten_us,
            "compute_bound_us": self.compute_bound_us, "speedup": self.speedup,
            "sites_slower": [row.location for row in self.sites if row.slower],
            "original_compute_us": self.original.compute_us,
            "rewritten_compute_us": self.rewritten.compute_us,
            "original_exposed_us": self.original.exposed_us,
            "rewritten_exposed_us": self.rewritten.exposed_us,
            "permutes": self.permutes, "overlapped": self.overlapped,
            "synchronous": self.synchronous, "platform": self.platform,
            "times": self.times_from,
            "collectives_left": [
                {"name": c.name, "opcode": c.opcode, "location": c.location}
                for c in self.rewritten.collectives],
            "loops": [asdict(loop) for loop in self.rewritten.loops],
            "loop_copies": [asdict(c) for c in self.rewritten.loop_copies],
            "original_temp_bytes": self.original_temp_bytes,
            "rewritten_temp_bytes": self.rewritten_temp_bytes,
            "chosen": self.chosen, "candidates": self.candidates,
            "outside_sites": self.outside,
            "original_matmul_us": self.original.matmul_us,
            "rewritten_matmul_us": self.rewritten.matmul_us,
            "model_problems": self.model_problems(),
        }

    @property
    def speedup(self) -> float:
        return self.original_us / self.rewritten_us if self.rewritten_us else 1.0

    @property
    def outside(self) -> dict[str, list[float]]:
        """What no site's row holds, before and after: the totals less the rows' sums
        (exposed communication, compute, time), so that rows and this add up to the
        module."""
        return outside_sites(self.sites, self.original, self.rewritten)

    @property
    def any_rewritten(self) -> bool:
        """Whether the module kept rewrote any site (a row may hold a rewritten forward
        site and its backward one left unchanged)."""
        return any(row.applied or row.rewritten for row in self.sites)

    @property
    def kept(self) -> str:
        """What the module the report kept is, by what was chosen: "rewritten" (with
        the candidate the compiled schedule chose, if one did), or the original and why
        (the schedule found no faster candidate, or no site was rewritten)."""
        if self.chosen == ORIGINAL:
            return "the original, kept (no rewritten candidate was faster)"
        if not self.any_rewritten:
            return "the original, kept (no site rewritten)"
        return f"rewritten ({self.chosen})" if self.chosen else "rewritten"

    def timeline_panels(self) -> dict[str, Analysis]:
        """The modelled schedules to draw, labelled by what was chosen: the original,
        then the module kept (`kept`)."""
        return {"original": self.original, self.kept: self.rewritten}

    def format(self) -> str:
        """The report as text: the table of sites, the notes under it, the verdict."""
        lines = self._table()
        lines += self._notes()
        lines.append(self.verdict())
        return "\n".join(lines) + "\n"

    def _table(self) -> list[str]:
        """The table's lines: a row per site, what is outside the sites, the total."""
        headers = ["location", "pass", "permutes overlapped", "exposed us", "compute us",
                   "before us", "after us", "speedup", "left"]
        rows = []
        for row in self.sites:
            rows.append([row.location, row.pattern.removeprefix("overlap-"),
                         f"{row.overlapped}/{row.permutes}"
                         + (f", {row.synchronous} sync" if row.synchronous else ""),
                         f"{row.original_exposed_us:.1f} -> {row.exposed_us:.1f}",
                         f"{row.original_compute_us:.1f} -> {row.rewritten_compute_us:.1f}",
                         f"{row.before_us:.1f}", f"{row.after_us:.1f}",
                         "moved here" if row.moved_here else
                         f"{row.speedup:.2f}x"
                         + (f", group {row.group.speedup:.2f}x" if row.group else "")
                         + (" SLOWER" if row.slower else ""),
                         ", ".join(row.collectives_left) or "-"])
        out = self.outside
        rows.append(["outside the sites", "", "-",
                     f"{out['exposed_us'][0]:.1f} -> {out['exposed_us'][1]:.1f}",
                     f"{out['compute_us'][0]:.1f} -> {out['compute_us'][1]:.1f}",
                     f"{out['us'][0]:.1f}", f"{out['us'][1]:.1f}", "", "-"])
        rows.append(["total", "", f"{self.overlapped}/{self.permutes}"
                     + (f", {self.synchronous} sync" if self.synchronous else ""),
                     f"{self.original.exposed_us:.1f} -> {self.rewritten.exposed_us:.1f}",
                     f"{self.original.compute_us:.1f} -> {self.rewritten.compute_us:.1f}",
                     f"{self.original_us:.1f}", f"{self.rewritten_us:.1f}",
                     f"{self.speedup:.2f}x", f"{len(self.rewritten.collectives)}"])
        widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]
        return ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip()
                for r in [headers, *rows]]

    def _notes(self) -> list[str]:
        """The lines under the table: sites slower or moved, temporaries, the choice,
        warnings."""
        lines = []
        told: list[list[str]] = []   # the groups whose rows were named
        for row in self.sites:
            if row.slower and not (row.group and row.group.locations in told):
                judged, named = row.group or row, row.location
                if row.group:
                    told.append(row.group.locations)
                    named = ", ".join(row.group.locations) + " (their sites share dots)"
                lines.append(f"{named}: predicted slower ({judged.before_us:.1f} -> "
                             f"{judged.after_us:.1f} us): {row.why_slower() or 'see --json'}")
            if row.moved_here:
                lines.append(f"{row.location}: an all_gather moved here (from the "
                             "all_reduce before it, by overlap-sequence-parallel), now a "
                             "ring; its time counts in the module's total")
        mib = 2 ** 20
        lines.append(f"{self.platform} temporaries: {self.original_temp_bytes / mib:.1f} MiB -> "
                     f"{self.rewritten_temp_bytes / mib:.1f} MiB; "
                     f"{len(self.rewritten.loop_copies)} loop-carried copies in loop bodies"
                     + (" (a buffer shifted an odd number of times per iteration is "
                        "copied; with --unroll=2 it alternates between two)"
                        if self.rewritten.loop_copies else "")
                     + "; "
                     f"{self.where} ({self.hardware} links, {self.times_from})")
        if self.chosen:
            tried = ", ".join(f"{name} {us:.1f} us" for name, us in self.candidates.items())
            lines.append(f"chosen by the compiled schedule: {self.chosen} (candidates: "
                         f"{tried}; the original {self.original_us:.1f} us)")
        lines += [f"warning: {problem}" for problem in self.model_problems()]
        unknown = [loop.name for a in (self.original, self.rewritten) for loop in a.loops
                   if loop.trip_count is None]
        if unknown:
            lines.append(f"warning: trip count not recognised for {', '.join(unknown)}: "
                         "each counted once")
        return lines

    def model_problems(self) -> list[str]:
        """Where the model disagrees with itself: a module whose compute is below the sum
        of its matmuls' estimates left a matmul out (as it did of libtpu's async
        collective fusions)."""
        return [f"the {name} module's modelled compute ({a.compute_us:.1f} us) is below its "
                f"matmuls' ({a.matmul_us:.1f} us): an instruction was priced as something "
                "else" for name, a in (("original", self.original), ("rewritten", self.rewritten))
                if a.compute_us < a.matmul_us * (1 - 1e-9)]

    def verdict(self) -> str:
        """One line: the predicted speedup of the whole module and the sites slower."""
        slower = [row for row in self.sites if row.slower]
        change = ("faster" if self.rewritten_us < self.original_us * (1 - SLOWER_TOLERANCE)
                  else "slower" if self.rewritten_us > self.original_us * (1 + SLOWER_TOLERANCE)
                  else "no faster")
        text = (f"verdict: predicted {change}, {self.original_us:.1f} us -> "
                f"{self.rewritten_us:.1f} us ({self.speedup:.2f}x) on {self.where}")
        text += (f"; {len(slower)} of {len(self.sites)} rewritten site(s) predicted slower"
                 if slower else "; no rewritten site predicted slower")
        left = [row for row in self.sites if not (row.applied or row.rewritten)]
        if left:
            why = ", ".join(dict.fromkeys(row.left_because for row in left if row.left_because))
            text += (f"; {len(left)} of {len(self.sites)} site(s) left unchanged"
                     + (f" ({why})" if why else ""))
        moved = [row for row in left if row.moved_slower]
        if moved:
            text += (f"; {len(moved)} site(s) left unchanged got slower around the rewritten "
                     f"ones ({', '.join(row.why_slower() or row.location for row in moved)})")
        return text + " (a model of the compiled schedule, not a measurement)"
