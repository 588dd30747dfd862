#!/usr/bin/env bash
# The whole test suite, from a fresh clone on a fresh machine (Debian 12, as root): installs
# what the tests need (Debian's mariadb-server and galera-4 with rsync, a Java runtime for
# Spark and Apache Kafka, Maven, Go for the databus consumer, Prometheus with promtool,
# Chromium and ChromeDriver for the web console's test, libfaketime, the Python packages into
# .venv, and into .venv-delta with Spark 4.2 for Delta Lake), fetches the JVM programs the
# tests run, then runs pytest on four workers, and the unit tier once more beside it under a
# faked date and zone. The tests start their own
# private MariaDB, Kafka and services; nothing needs to be running.
# Extra arguments go to pytest, e.g. `bash tests/run.sh -k listener -x`.
#
# JVM programs (Apache Kafka; a component per folder tests/jvm/<name>/ with a pom.xml of
# pinned versions): tests/jvm/fetch.sh resolves them from Maven Central once, into
# ${CDC_TEST_CACHE:-$HOME/.cache/mariadb-cdc-tests}/m2, and writes each one's classpath
# beside it (classpath/<name>-<pom hash>.txt), which tests/jvm/__init__.py reads. A later run
# finds them there and starts no Maven (well under a second); a test never downloads. Run
# `bash tests/jvm/fetch.sh` yourself before `pytest` outside this script.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v mariadbd >/dev/null 2>&1 || [ -x /usr/sbin/mariadbd ] || missing+=(mariadb-server mariadb-client)
command -v java >/dev/null 2>&1 || missing+=(default-jre-headless)  # local Spark, Apache Kafka
command -v mvn >/dev/null 2>&1 || missing+=(maven)  # fetches the JVM programs (tests/jvm/fetch.sh)
command -v cc >/dev/null 2>&1 || missing+=(gcc)  # builds the transcoder (cdcserver/store/_transcode.pyx)
command -v go >/dev/null 2>&1 || missing+=(golang-go)  # the Go databus consumer (tests/databus_go)
[ -e /usr/lib/galera/libgalera_smm.so ] || missing+=(galera-4)  # tests/integration/test_galera.py's cluster
command -v rsync >/dev/null 2>&1 || missing+=(rsync)  # ... its state transfers
command -v socat >/dev/null 2>&1 || missing+=(socat)
command -v ss >/dev/null 2>&1 || missing+=(iproute2)  # the transfer script waits with ss
command -v nft >/dev/null 2>&1 || missing+=(nftables)  # tests/netfault.py's broken links
command -v iptables >/dev/null 2>&1 || missing+=(iptables)  # ... and its slow ones (NFQUEUE)
[ -e /usr/include/libnetfilter_queue/libnetfilter_queue.h ] || missing+=(libnetfilter-queue-dev)
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)  # tests/integration/test_prometheus.py
command -v chromium >/dev/null 2>&1 || missing+=(chromium)  # the web console's browser test
command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)  # ... driven by Selenium
command -v faketime >/dev/null 2>&1 || missing+=(faketime)  # the unit tier on another day
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
# tests/netdelay.py holds packets the kernel queues to it (the kernel has no netem): Linux
# only, built against libnetfilter_queue, so not among the test extras
.venv/bin/pip install -q --disable-pip-version-check 'NetfilterQueue>=1.1,<2'
bash tests/jvm/fetch.sh
# Delta Lake inside Spark (tests/delta_lake.py): its newest release (4.4) is built for Spark 4.2
# and fails on the 4.3 above, so the tests of Spark's own MERGE run in a second environment
# with PySpark 4.2 and this project, as a user of Delta would install it.
[ -x .venv-delta/bin/python ] || python3 -m venv .venv-delta
.venv-delta/bin/pip install -q --disable-pip-version-check -e '.[spark]' 'pyspark==4.2.0'

# The unit tier a second time, beside the suite, on another day in another zone
# (libfaketime): more than a year ahead, on a leap day, in a zone with a half-hour offset,
# at an hour when the local date is not UTC's. A test that depends on the day it runs or on
# the zone fails here, not on the day after it was written. Its output is printed at the end.
# (The monotonic clock is faked too: with it excluded, libfaketime 0.9.10 fails Python's
# time.sleep with EINVAL. FAKETIME_DONT_RESET: a child process's clock goes on from its
# parent's instead of starting again at the given time.)
# It runs at a lower priority (nice): it is background work, and the suite's own processes
# have deadlines they cannot change (Spark waits 10 s, hard-coded, for a Python worker to
# connect back; on two cores shared with this tier one missed it).
other_day="$(mktemp -d)"
FAKETIME_DONT_RESET=1 TZ=America/St_Johns nice -n 10 faketime -m '2028-02-29 21:15:00' \
  .venv/bin/python -m pytest tests/unit -q -p no:cacheprovider \
  --basetemp "${other_day}/tmp" >"${other_day}/log" 2>&1 &
other_day_pid=$!

# Four workers (pytest-xdist), each with its own MariaDB, broker, ports and directories; the
# tests on the local Spark session share one worker (one JVM). Most tests wait on servers,
# so four beat two cores' worth. The slowest tests are listed at the end.
suite=0
.venv/bin/python -m pytest -n 4 --dist loadgroup --durations=25 "$@" || suite=$?

moved=0
wait "${other_day_pid}" || moved=$?
echo "tests/run.sh: the unit tier on 2028-02-29 21:15 in America/St_Johns (faketime):"
if [ "${moved}" -eq 0 ]; then tail -n 1 "${other_day}/log"; else cat "${other_day}/log"; fi
rm -rf "${other_day}"
[ "${suite}" -eq 0 ] && [ "${moved}" -eq 0 ]
