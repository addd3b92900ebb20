"""Test harness shared by the test suite and bench/ (not shipped in the package).

* :mod:`tests.harness.chaos`: trainer and ingester killed with SIGKILL at random moments;
* :mod:`tests.harness.ckpt_kill`: trainings killed right after a checkpoint, then resumed;
* :mod:`tests.harness.coco`: the COCO test data and a check with pycocotools and faster-coco-eval;
* :mod:`tests.harness.hosts`: ``host_fixture``, a test's own host of just the named plugins;
* :mod:`tests.harness.netaudit`: an audit hook that records and refuses network use;
* :mod:`tests.harness.postgres`: a throw-away PostgreSQL server for the lake tests;
* :mod:`tests.harness.vulkan`: the messages of the Vulkan validation layer, collected in a block.

Import them as ``tests.harness.X`` from the repository root (pytest puts it on
``sys.path``, see ``pythonpath`` in pyproject.toml; ``python -m bench.X`` runs from it).
The public test helpers for plugin authors (the conformance checks and their pytest
plugin) stay in :mod:`tracker.testing`.
"""
