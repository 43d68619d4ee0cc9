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
# The example job: a real model that checkpoints on request and resumes (numpy, installed with
# corral). The wheel carries it for `corral demo`; here too, for the README's job files run from
# /app.
COPY examples examples
# `corral demo` replays a few jobs of the public Philly trace, which is not ours to bake in:
# mount the folder that holds philly/philly.csv at /traces (docker run -v DIR:/traces ...).
ENV CORRAL_TRACES=/traces
ENTRYPOINT []
