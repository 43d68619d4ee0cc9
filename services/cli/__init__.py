"""The ``corral`` command and what only it uses: its parser (``main``), the verbs by what they act
on (``jobs``, ``cluster``, ``serve``, ``queues``, ``logtools``), how they print (``display``) and
read flags (``flags``), how it reaches a corral and as whom (``access``), job and queue files
(``jobfile``), log files (``logfile``), tables (``table``), a whole corral on one machine
(``up``), the narrated demo (``demo``, ``narrate``, ``watch``) and ``corral sim`` (``sim``)."""
