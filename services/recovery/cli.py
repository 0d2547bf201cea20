"""GPU recovery's command: `nodeward recovery force-drain NODE`, an operator control
(`nodeward.cli.controls`) the recovery service answers and audits.

Named in its plugin (`services.recovery.SERVICE`). Typer only at import.
"""

from __future__ import annotations

import typer

from nodeward.cli.controls import control

recovery_app = typer.Typer(
    help="GPU recovery: force a blocked drain past its disruption budgets.", no_args_is_help=True
)


@recovery_app.command("force-drain")
@control("recovery", "force-drain", "NODE", timeout=30.0)
def recovery_force_drain() -> None:
    """Delete the pods a PodDisruptionBudget keeps on NODE, whose recovery is blocked on its
    drain (nodeward never does on its own); exempt pods and pods Falco isolated stay."""
