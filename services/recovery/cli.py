"""GPU recovery's commands: `nodeward recovery force-drain NODE`, `pause` and `resume`,
operator controls (`nodeward.cli.controls`) the recovery service answers and audits.

Named in its plugin (`services.recovery.SERVICE`). Typer only at import.
"""

from __future__ import annotations

import typer

from nodeward.cli.controls import control

recovery_app = typer.Typer(
    help="GPU recovery: force a blocked drain past its disruption budgets; pause and resume "
    "all new remediation.",
    no_args_is_help=True,
)


@recovery_app.command("force-drain")
@control("recovery", "force-drain", "NODE", timeout=30.0)
def recovery_force_drain() -> None:
    """Delete the pods a PodDisruptionBudget keeps on NODE, whose recovery is blocked on its
    drain (nodeward never does on its own); exempt pods and pods Falco isolated stay."""


@recovery_app.command("pause")
@control("recovery", "pause")
def recovery_pause() -> None:
    """Stop all new remediation at once: no recovery starts, and those under way (hung
    nodes' ladders included) wait where they stand until `resume`."""


@recovery_app.command("resume")
@control("recovery", "resume")
def recovery_resume() -> None:
    """Lift the pause: recoveries go on from where they stood."""
