"""The ``corral`` command and what only it uses: the verbs and their parser (``main``), how it
reaches a corral and as whom (``access``), job and queue files (``jobfile``), log files
(``logfile``), tables (``table``), a whole corral on one machine (``up``), the narrated demo
(``demo``, ``narrate``, ``watch``) and ``corral sim`` (``sim``)."""
