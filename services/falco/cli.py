"""The Falco response's command: `nodeward falco release NAMESPACE/POD`, an operator control
(`nodeward.cli.controls`) the falco service answers and audits.

Named in its plugin (`services.falco.SERVICE`). Typer only at import.
"""

from __future__ import annotations

import typer

from nodeward.cli.controls import control

falco_app = typer.Typer(
    help="Falco response: lift an isolation nodeward applied.", no_args_is_help=True
)


@falco_app.command("release")
@control("falco", "release", "NAMESPACE/POD")
def falco_release() -> None:
    """Lift the network isolation nodeward put on a pod; refuses one it did not isolate."""
