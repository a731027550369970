# The image every agent-jobs service runs: the CLI, the Celery workers and beat, the
# approvals listener and Flower. Your own agents: build FROM this image, install your
# package, and point AGENT_JOBS_APP at its AgentApp.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY agent_jobs ./agent_jobs
COPY tasks ./tasks
# With every door's extra: the HTTP API (`agent-jobs serve`), Prometheus metrics and
# OpenTelemetry traces, each off until its settings turn it on. Flower's config file,
# installed with the package, at a path that does not change with Python's version:
# `celery -A agent_jobs.worker flower --conf=/etc/agent-jobs/flowerconfig.py`.
RUN pip install '.[api,metrics,otel,openai,anthropic]' \
    && mkdir -p /etc/agent-jobs \
    && ln -s "$(python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/tasks/flowerconfig.py" \
        /etc/agent-jobs/flowerconfig.py \
    && test -f /etc/agent-jobs/flowerconfig.py \
    && useradd --create-home --uid 10001 agentjobs \
    && mkdir -p /var/lib/agent-jobs \
    && chown agentjobs /var/lib/agent-jobs

# Workers refuse to run tasks as root; nothing here needs it.
USER agentjobs
WORKDIR /var/lib/agent-jobs
CMD ["agent-jobs", "--help"]
