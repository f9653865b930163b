#!/usr/bin/env bash
# Makes sure the programs some tests drive are installed: gdb (the tests that force an
# interleaving of PostgreSQL backends stop them with it), PostgreSQL's server programs
# (those tests and make chaos run a private cluster), RabbitMQ's server (make chaos's
# broker-restart runs a private node), PgBouncer (the tests that run nudge through it in
# transaction pooling mode start their own), Chromium (the console's tests drive it
# headless) and promtool (internal/deploycheck checks and unit-tests deploy/prometheus's alert
# rules with it; Debian ships it in prometheus). As root with apt-get it installs what is missing;
# otherwise it says what to install. Without them those tests skip, or fail with CI=true.
set -euo pipefail

missing=()
command -v gdb >/dev/null 2>&1 || missing+=(gdb)
if ! command -v pg_ctl >/dev/null 2>&1 && ! ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1; then
	missing+=(postgresql)
fi
command -v pgbouncer >/dev/null 2>&1 || missing+=(pgbouncer)
if [[ ! -x /usr/lib/rabbitmq/bin/rabbitmq-server ]] && ! command -v rabbitmq-server >/dev/null 2>&1; then
	missing+=(rabbitmq-server)
fi
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
((${#missing[@]} == 0)) && exit 0

if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; then
	echo "tools: installing ${missing[*]}"
	apt-get update -qq >/dev/null
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
	echo "tools: ${missing[*]} not found: install them (e.g. apt-get install ${missing[*]}); the tests that need them skip without" >&2
fi
