# One image for every corral service of compose.yaml and for the jobs its agents run.
FROM python:3.11-slim
# Agents run workers in bubblewrap namespaces (with logins, no sandbox means no job).
RUN apt-get update && apt-get install -y --no-install-recommends bubblewrap \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml README.md ./
COPY events events
COPY projections projections
COPY services services
COPY corral corral
RUN pip install --no-cache-dir .
# The example job of the demo and the README: a real model that checkpoints on request and
# resumes (numpy, installed with corral).
COPY examples examples
ENTRYPOINT []
