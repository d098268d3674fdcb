# The SpecLens dashboard (CPU). The GPU-node worker image comes with the worker issue.
FROM python:3.11-slim
RUN apt-get update && apt-get install -y --no-install-recommends chromium make git && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY requirements.txt requirements-dev.txt ./
RUN pip install --no-cache-dir torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu \
    && pip install --no-cache-dir -r requirements.txt
COPY . .
ENV SPECLENS_DATA=/data BROWSER_PATH=/usr/bin/chromium
VOLUME /data
EXPOSE 8501
CMD ["python", "-m", "dashboard.serve", "--server.headless", "true", "--server.port", "8501", "--server.address", "0.0.0.0", "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none"]
