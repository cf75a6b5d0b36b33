"""Runtime event producers beside the compiled graphs: training steps and their phases
(``steps``) and device time (``cuda``). Each imports torch; this package does not."""
