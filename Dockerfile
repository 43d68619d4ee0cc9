FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY events events
COPY projections projections
COPY services services
COPY corral corral
RUN pip install --no-cache-dir .
ENTRYPOINT []
