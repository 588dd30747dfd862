#!/usr/bin/env bash
# The whole test suite, from a fresh clone on a fresh machine (Debian 12, as root): installs
# what the tests need (Debian's mariadb-server and galera-4 with rsync, a Java runtime for
# Spark, Go for the databus consumer, Prometheus with promtool, Chromium and ChromeDriver for the
# web console's test, the Python packages into
# .venv), then runs pytest on four workers. The
# tests start their own private MariaDB and services; nothing needs to be running.
# Extra arguments go to pytest, e.g. `bash tests/run.sh -k listener -x`.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v mariadbd >/dev/null 2>&1 || [ -x /usr/sbin/mariadbd ] || missing+=(mariadb-server mariadb-client)
command -v java >/dev/null 2>&1 || missing+=(default-jre-headless)  # local Spark
command -v cc >/dev/null 2>&1 || missing+=(gcc)  # builds the transcoder (cdcserver/store/_transcode.pyx)
command -v go >/dev/null 2>&1 || missing+=(golang-go)  # the Go databus consumer (tests/databus_go)
[ -e /usr/lib/galera/libgalera_smm.so ] || missing+=(galera-4)  # tests/integration/test_galera.py's cluster
command -v rsync >/dev/null 2>&1 || missing+=(rsync)  # ... its state transfers
command -v socat >/dev/null 2>&1 || missing+=(socat)
command -v ss >/dev/null 2>&1 || missing+=(iproute2)  # the transfer script waits with ss
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)  # tests/integration/test_prometheus.py
command -v chromium >/dev/null 2>&1 || missing+=(chromium)  # the web console's browser test
command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)  # ... driven by Selenium
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "tests/run.sh: please install ${missing[*]} (needs root)" >&2
    exit 1
  fi
  echo "tests/run.sh: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check -e '.[test,kafka,spark,lakehouse,pipelines]'

# Four workers (pytest-xdist), each with its own MariaDB, broker, ports and directories; the
# Spark tests share one worker (one JVM). Most tests wait on servers, so four beat two cores'
# worth. The slowest tests are listed at the end.
exec .venv/bin/python -m pytest -n 4 --dist loadgroup --durations=25 "$@"
