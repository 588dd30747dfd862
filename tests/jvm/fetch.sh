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
# A program published as a distribution to unpack (Apicurio Registry's tar.gz, whose parent
# pom Maven Central lacks, so its dependencies cannot be collected) names it in the pom's
# maven-dependency-plugin <artifactItems> instead: it is unpacked (dependency:unpack) into
# <cache>/unpacked/<component>-<hash>/, and the classpath file names the jars at the top of
# it (a Quarkus runner jar, whose manifest names its lib/).
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
  if grep -q '<artifactItems>' "${pom}"; then
    unpacked="${cache}/unpacked/$(basename "${out}" .txt)"
    rm -rf "${unpacked}.tmp" "${unpacked}.markers"
    # (fetch.markers: where the pom has the plugin keep the markers by which it skips what
    # it unpacked before, out of the checkout)
    if mvn -B -q -f "${pom}" -Dmaven.repo.local="${cache}/m2" dependency:unpack \
        -DoutputDirectory="${unpacked}.tmp" -Dfetch.markers="${unpacked}.markers" \
        >"${tmp}.log" 2>&1; then
      rm -rf "${unpacked}" "${unpacked}.markers" && mv "${unpacked}.tmp" "${unpacked}"
      find "${unpacked}" -maxdepth 1 -name '*.jar' | sort | paste -sd ':' > "${tmp}"
      [ -s "${tmp}" ] || echo "no jar at the top of ${unpacked}" >> "${tmp}.log"
    fi
  elif mvn -B -q -f "${pom}" -Dmaven.repo.local="${cache}/m2" dependency:build-classpath \
      -Dmdep.outputFile="${tmp}" -Dmdep.pathSeparator=':' >"${tmp}.log" 2>&1; then
    :
  fi
  if [ ! -s "${tmp}" ]; then
    cat "${tmp}.log" >&2
    rm -f "${tmp}" "${tmp}.log"
    echo "tests/jvm/fetch.sh: Maven could not resolve ${name} (${pom})" >&2
    exit 1
  fi
  rm -f "${tmp}.log"
  chmod 644 "${tmp}"
  mv "${tmp}" "${out}"
done
