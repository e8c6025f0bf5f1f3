"""The judge layer: records against the published numbers. The papers' tables (``reference``), the verdict rule
(``verdicts``), the side-by-side tables (``tables``), paired metrics against a reference run (``paired``), the counts
of reproduced cells (``counts``), the number-level regression check (``regression_check``) and the leaderboard's
statistics (``leaderboard``). Imports ``core``, ``methods`` and ``run``, never ``present``."""
