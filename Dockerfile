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
RUN pip install . \
    && useradd --create-home --uid 10001 agentjobs \
    && mkdir -p /var/lib/agent-jobs \
    && chown agentjobs /var/lib/agent-jobs

# Workers refuse to run tasks as root; nothing here needs it.
USER agentjobs
WORKDIR /var/lib/agent-jobs
CMD ["agent-jobs", "--help"]
