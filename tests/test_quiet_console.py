"""The console shows the run's own lines: the two warnings torch.compile logs on a first compilation (a CUDA toolkit
without a GPU, the optimizer step's profiler label) are dropped, and nothing else is."""

from __future__ import annotations

import logging

from cleanrl_embodied.shared.compilation import QUIET_COMPILE_WARNINGS, _quiet_compile_warnings


def test_compiling_drops_only_the_two_known_warnings(caplog):
    _quiet_compile_warnings()
    for name, start in QUIET_COMPILE_WARNINGS.items():
        logger = logging.getLogger(name)
        with caplog.at_level(logging.WARNING, logger=name):
            caplog.clear()
            logger.warning(start + " %s", "(detail)")
            logger.warning("another warning from %s", name)
        assert [r.getMessage() for r in caplog.records] == [f"another warning from {name}"]
