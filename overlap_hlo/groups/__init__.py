"""Layer 2, replica groups: Shardy meshes and manual axes, and the collectives' groups
read as rings of devices.

Imports from overlap_hlo.ir and overlap_hlo.plan.
"""
