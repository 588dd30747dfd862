#!/usr/bin/env bash
# Resolves the JVM programs the tests run (tests/jvm/<component>/pom.xml, pinned versions)
# with Maven into a cache that outlives the checkout, and writes each one's classpath to
# <cache>/classpath/<component>-<hash of its pom.xml>.txt, which tests/jvm/__init__.py's
# classpath() reads. Nothing is downloaded while a test runs: tests/run.sh calls this first.
#
#   bash tests/jvm/fetch.sh             every component
#   bash tests/jvm/fetch.sh kafka ...   these
#
# The cache is ${CDC_TEST_CACHE:-$HOME/.cache/mariadb-cdc-tests} (the Maven repository in
# m2/). A component whose classpath file for this very pom.xml exists, with every jar it names
# still there, is not resolved again: a warm run costs no Maven start. (Named by the pom's
# content, not compared by date: a fresh clone's pom is newer than any cache, and checkouts
# that pin different versions share one cache without resolving in turn.)
# Adding a component: a folder tests/jvm/<name>/ with a pom.xml (packaging pom, pinned
# <dependencies>); then classpath("<name>") in the tests.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cache="${CDC_TEST_CACHE:-$HOME/.cache/mariadb-cdc-tests}"
mkdir -p "${cache}/m2" "${cache}/classpath"

if [ $# -gt 0 ]; then
  components=("$@")
else
  components=()
  for pom in "${here}"/*/pom.xml; do
    components+=("$(basename "$(dirname "${pom}")")")
  done
fi

fresh() {  # the classpath file exists and every jar it names too
  local out="$1" jar
  [ -s "${out}" ] || return 1
  while IFS= read -r -d ':' jar; do
    [ -f "${jar}" ] || return 1
  done < <(tr -d '\n' < "${out}"; printf ':')
}

for name in "${components[@]}"; do
  pom="${here}/${name}/pom.xml"
  if [ ! -f "${pom}" ]; then
    echo "tests/jvm/fetch.sh: no component '${name}' (no ${pom})" >&2
    exit 1
  fi
  out="${cache}/classpath/${name}-$(sha256sum "${pom}" | cut -c1-16).txt"
  fresh "${out}" && continue
  echo "tests/jvm/fetch.sh: resolving ${name} (Maven, into ${cache}/m2)"
  # Written beside, then renamed: a run that stops halfway leaves no truncated classpath,
  # and two runs at once (two checkouts sharing the cache) each write a whole one.
  tmp="$(mktemp "${out}.XXXXXX")"
  if ! mvn -B -q -f "${pom}" -Dmaven.repo.local="${cache}/m2" dependency:build-classpath \
      -Dmdep.outputFile="${tmp}" -Dmdep.pathSeparator=':' >"${tmp}.log" 2>&1; then
    cat "${tmp}.log" >&2
    rm -f "${tmp}" "${tmp}.log"
    echo "tests/jvm/fetch.sh: Maven could not resolve ${name} (${pom})" >&2
    exit 1
  fi
  rm -f "${tmp}.log"
  chmod 644 "${tmp}"
  mv "${tmp}" "${out}"
done
