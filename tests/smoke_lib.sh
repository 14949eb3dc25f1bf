# Sourced by the etcdctl smoke scripts: a free loopback port, and one member started on it.

# A random loopback port that nothing answers on (not $PORT).
free_port() {
	local p
	for _ in $(seq 50); do
		p=$((${SMOKE_PORT_MIN:-20000} + RANDOM % ${SMOKE_PORT_SPAN:-20000}))
		[[ "$p" != "${PORT:-}" ]] && ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null && break
	done
	echo "$p"
}

# `start_member DATA_DIR LOG URL [FLAG...]`: $SMOKE_ETCD (an etcd binary) if set, else
# $CAIRN_BIN, serving URL with its data in DATA_DIR and its log in LOG, with the extra flags;
# in the background, its pid in $PID.
start_member() {
	local data=$1 log=$2 url=$3
	shift 3
	if [[ -n "${SMOKE_ETCD:-}" ]]; then
		local peer
		peer=http://127.0.0.1:$(free_port)
		"$SMOKE_ETCD" --name default --data-dir "$data" --listen-client-urls "$url" \
			--advertise-client-urls "$url" --listen-peer-urls "$peer" --initial-advertise-peer-urls "$peer" \
			--initial-cluster "default=$peer" --log-level warn "$@" 2>"$log" &
	else
		"${CAIRN_BIN:?set CAIRN_BIN to the cairn binary (or SMOKE_ETCD to an etcd binary)}" serve \
			--data-dir "$data" --listen-client-urls "$url" "$@" 2>"$log" &
	fi
	PID=$!
}
