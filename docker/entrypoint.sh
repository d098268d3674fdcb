#!/bin/sh
# SpecLens GPU-node image entry point (Dockerfile.gpu). The first argument picks what to run:
#   worker [--once] [--ray ADDRESS]   the job worker (default)
#   dashboard                         the Streamlit dashboard on $PORT (default 8501)
#   ray-head | ray-node               a Ray head (port 6379) or a node joining $RAY_ADDRESS, in the foreground
#   submit|cancel|jobs|runs|capture|bench|align|...   any `python -m backend` command
#   anything else                     run as given (e.g. bash)
set -e
cmd="${1:-worker}"
[ "$#" -gt 0 ] && shift
case "$cmd" in
  worker)
    exec python3 -m backend worker "$@" ;;
  dashboard)
    exec python3 -m dashboard.serve --server.headless true --server.port "${PORT:-8501}" \
      --server.address 0.0.0.0 --browser.gatherUsageStats false --server.fileWatcherType none "$@" ;;
  ray-head)
    exec ray start --head --block --port="${RAY_PORT:-6379}" --dashboard-host=0.0.0.0 "$@" ;;
  ray-node)
    : "${RAY_ADDRESS:?set RAY_ADDRESS=head-host:6379}"
    exec ray start --block --address="$RAY_ADDRESS" "$@" ;;
  submit|cancel|jobs|runs|capture|bench|align|import-capture|db|demo)
    exec python3 -m backend "$cmd" "$@" ;;
  *)
    exec "$cmd" "$@" ;;
esac
