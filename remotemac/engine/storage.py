"""Will the run fit on remote_root's volume? Asked at the end of provision.

The slice (stored on the host), the expected outputs and the margin the job must
keep free (``stop_when.min_free_disk``, below which the runner stops it with
``storage-limit``) must fit in what is free once the venv is installed; else the
run is refused before any data travels, with one line that says what to do.
Nothing tells us how much a workload will write, so its outputs are estimated as
the slice's size (a validation run's predictions and metrics are rarely larger
than its inputs); the record keeps the figures.
"""

from __future__ import annotations

from remotemac.agent.protocol import JsonObject, Op
from remotemac.engine.context import HostBinding, RunContext
from remotemac.engine.phaseresults import ProvisionHost


def slice_bytes(ctx: RunContext) -> int:
    from remotemac.engine.sync import choose_slice

    if ctx.playbook.data is None or ctx.playbook.data.path is None:
        return 0
    selection = choose_slice(ctx)
    return int(selection.total_bytes) if selection is not None else 0


async def check_space(
    ctx: RunContext, binding: HostBinding, provisioned: ProvisionHost
) -> JsonObject:
    """The agent's ``check_space`` for this host (raises AgentError ``no-space`` on refusal),
    as it answered: the figures go into the provision's result unread (ProvisionHost.space)."""
    if ctx.slice_bytes is None:  # every host gets the slice: select it once
        ctx.slice_bytes = slice_bytes(ctx)
    data = ctx.slice_bytes
    venv_python = provisioned.venv_python or ""
    venv_dir = (
        venv_python.rsplit("/bin/", 1)[0]
        if ctx.playbook.environment.venv and "/bin/" in venv_python
        else None
    )
    return await binding.agent.call(
        Op.CHECK_SPACE,
        {
            "path": provisioned.run_dir,
            "items": {"slice": data, "outputs (est.)": data},
            "venv_dir": venv_dir,
            "min_free": int(ctx.playbook.stop_when.min_free_disk),
        },
    )
