"""What a target changes in the rings built for it: a `TargetForm`, chosen once from the
pass's target (`RewritePass.form`) and read by planners and emitters, which hold no
branch on the platform themselves."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TargetForm:
    """The properties of a target that the rings' plans and IR depend on (the CPU's,
    or no target's, by default)."""

    allocates: bool = False         # buffers written whole are left uninitialised
    single_trip_loop: bool = False  # a loop that runs once is built (RingPlan)
    views_in_loop: bool = False     # loops slice their invariant operands (RingPlan)
    tied_sums: bool = False         # rings that sum tie their rounds; built only if asked
    serial_blocks: bool = True      # gather round of 3+ blocks: each written before the next
    last_add_apart: bool = False    # one-stream scatter: last arrival's add out of the fusion
    own_add_apart: bool = True      # two-stream scatter: own block's down add out of the fusion
    paced_sends: bool = False       # all_to_all: each send waits for the dot two steps back
    gather_unroll: int = 1          # all_gather ring rounds per iteration unless given

    @staticmethod
    def of(platform: str) -> TargetForm:
        """The form for `platform` ("tpu", "gpu", "cpu" or "": no target)."""
        return FORMS.get(platform, DEFAULT)


DEFAULT = TargetForm()
# Two gather rounds per iteration on TPU and GPU: the loop alternates two buffers
# instead of copying the shard it carries.
FORMS = {"tpu": TargetForm(allocates=True, single_trip_loop=True, views_in_loop=True,
                           tied_sums=True, serial_blocks=False, own_add_apart=False,
                           gather_unroll=2),
         "gpu": TargetForm(allocates=True, last_add_apart=True, paced_sends=True,
                           gather_unroll=2)}
