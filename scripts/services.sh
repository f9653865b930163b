#!/usr/bin/env bash
# Makes sure PostgreSQL and RabbitMQ answer on the URLs the tests use.
#
#   NUDGE_TEST_POSTGRES_URL  default postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable
#   NUDGE_TEST_AMQP_URL      default amqp://guest:guest@127.0.0.1:5672/
#
# If both answer, it does nothing. Otherwise it starts what is missing: with `docker compose up -d
# --wait` where a Docker engine runs, else with the local Debian services where installed
# (pg_ctlcluster, rabbitmq-server), and waits until each answers. If it cannot, it says what to
# install or run and exits 1.
set -euo pipefail

cd "$(dirname "$0")/.."

PG_URL=${NUDGE_TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable}
AMQP_URL=${NUDGE_TEST_AMQP_URL:-amqp://guest:guest@127.0.0.1:5672/}
WAIT_SECONDS=${NUDGE_SERVICES_WAIT:-90}

# host_port URL DEFAULT_PORT prints "host port" of a postgres:// or amqp:// URL.
host_port() {
	local rest=${1#*://}
	rest=${rest#*@}
	rest=${rest%%/*}
	rest=${rest%%\?*}
	local host=${rest%%:*} port=$2
	[[ $rest == *:* ]] && port=${rest##*:}
	[[ -z $host ]] && host=127.0.0.1
	echo "$host $port"
}

read -r PG_HOST PG_PORT < <(host_port "$PG_URL" 5432)
read -r AMQP_HOST AMQP_PORT < <(host_port "$AMQP_URL" 5672)

redact() { sed -E 's#(://[^:/@]*):[^@/]*@#\1:xxxxx@#' <<<"$1"; }

pg_up() {
	if command -v pg_isready >/dev/null 2>&1; then
		pg_isready -q -h "$PG_HOST" -p "$PG_PORT" -t 2
	else
		timeout 2 bash -c "exec 3<>/dev/tcp/$PG_HOST/$PG_PORT" 2>/dev/null
	fi
}

# amqp_up sends the AMQP 0-9-1 protocol header and expects the broker's Connection.Start frame
# (frame type 1), so a port that is open while RabbitMQ still boots does not count.
amqp_up() {
	timeout 3 bash -c '
		exec 3<>/dev/tcp/$0/$1 || exit 1
		printf "AMQP\x00\x00\x09\x01" >&3
		[[ $(head -c 1 <&3 | od -An -tx1 | tr -d " ") == 01 ]]
	' "$AMQP_HOST" "$AMQP_PORT" 2>/dev/null
}

is_local() { [[ $1 == 127.0.0.1 || $1 == localhost || $1 == ::1 ]]; }

wait_for() { # wait_for NAME CHECK
	local i
	for ((i = 0; i < WAIT_SECONDS; i++)); do
		"$2" && return 0
		sleep 1
	done
	echo "services: $1 did not answer within ${WAIT_SECONDS}s" >&2
	return 1
}

pg_ok=0 amqp_ok=0
pg_up && pg_ok=1
amqp_up && amqp_ok=1
if ((pg_ok && amqp_ok)); then
	echo "services: PostgreSQL ($PG_HOST:$PG_PORT) and RabbitMQ ($AMQP_HOST:$AMQP_PORT) answer"
	exit 0
fi

if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
	echo "services: starting them with docker compose"
	docker compose up -d --wait
else
	if ((!pg_ok)) && is_local "$PG_HOST" && [[ $PG_PORT == 5432 ]] && command -v pg_ctlcluster >/dev/null 2>&1; then
		for version in $(ls /etc/postgresql 2>/dev/null); do
			echo "services: starting local PostgreSQL $version"
			pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
		done
	fi
	if ((!amqp_ok)) && is_local "$AMQP_HOST" && [[ $AMQP_PORT == 5672 ]] && command -v rabbitmq-server >/dev/null 2>&1; then
		echo "services: starting local RabbitMQ"
		# A node holds a file per queue and socket: at the usual 1,024 it stops accepting
		# connections at about 3,000 queues (docs/operations/pgbouncer-and-sizing.md).
		(ulimit -Sn 65536 2>/dev/null || ulimit -Sn "$(ulimit -Hn)"; exec rabbitmq-server -detached) || true
	fi
fi

failed=0
wait_for "PostgreSQL at $(redact "$PG_URL")" pg_up || failed=1
wait_for "RabbitMQ at $(redact "$AMQP_URL")" amqp_up || failed=1
if ((failed)); then
	cat >&2 <<MSG
services: PostgreSQL and RabbitMQ are needed and could not be started here. Either
  - install Docker and run: make up        (docker compose: PostgreSQL 16, RabbitMQ 3.13), or
  - install them locally (Debian/Ubuntu: apt-get install postgresql rabbitmq-server), or
  - point NUDGE_TEST_POSTGRES_URL and NUDGE_TEST_AMQP_URL at running servers.
MSG
	exit 1
fi
echo "services: PostgreSQL ($PG_HOST:$PG_PORT) and RabbitMQ ($AMQP_HOST:$AMQP_PORT) answer"
