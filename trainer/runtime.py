"""Process set-up shared by the `trainer` commands: multi-host start and the compile cache.

JAX is imported inside each function, lazily for start-up time: `trainer --help` imports
this module and never loads JAX.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["init_distributed", "enable_compile_cache"]


def init_distributed(coordinator: str | None, num_processes: int, process_id: int) -> None:
    """Join the other processes of a multi-host run (a no-op for one process)."""
    if num_processes <= 1 and not coordinator:
        return
    if not coordinator:
        raise ValueError("multi-host: --num-processes > 1 needs --coordinator HOST:PORT")
    import jax  # lazy for start-up time

    # CPU processes exchange collectives through gloo; GPUs/TPUs ignore this setting.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=coordinator, num_processes=num_processes, process_id=process_id
    )


def enable_compile_cache() -> None:
    """Reuse compiled steps across invocations (a tiny model compiles for tens of seconds on CPU)."""
    import jax  # lazy for start-up time

    if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "observatory-trainer" / "jax"
    try:
        cache.mkdir(parents=True, exist_ok=True)
        jax.config.update("jax_compilation_cache_dir", str(cache))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
    except OSError:
        pass
