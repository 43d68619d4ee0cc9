"""What every service runs on: the shell that consumes, folds, decides and appends (``shell``),
the leader lease per decision role (``lease``) and OpenTelemetry at the edges (``tracing``)."""
