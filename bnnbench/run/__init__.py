"""The run layer: from a configuration to a record. Hydra configuration and its typed schemas (``config``,
``schema``, ``protocol``), hyper-parameter selection (``selection``, ``hpo``), the training engine and its fits on
the replica axis (``engine``, ``fit``, ``replica_workers``, ``compiled``, ``threads``), the stages of a protocol and
active learning (``stages``, ``active``, ``splits``), one cell end to end (``execute``, ``cell``), the run
directories and records (``results``: the one owner), record migrations (``migrate``), signals, the method contract
checks (``contract``) and cells as jobs through Hydra's launchers (``launchers``). Imports ``core`` and ``methods``,
never ``judge`` or ``present``."""
