// Package daemon is the agent's composition root: what `edgefence run`
// runs, and what the sandbox and the benchmarks build the agent through.
//
// New(ctx, cfg, Options) checks etcd's TLS handshake, then opens and owns,
// in this order: the API socket (claimed first, so a second agent on the
// same config fails before it campaigns), the fence table and bridge (home
// gateway only), the outbox, the history files, the twin cache, the
// firmware image cache (jobs on; it holds no open files between jobs), the etcd
// client (with etcd auth it waits for etcd until ctx ends), the MQTT
// commander (the bridge's command topics subscribed before it connects)
// and the agent, whose Sender is the commander. The devices' state
// reports are subscribed on the running client once the agent exists, so
// no handler runs before it. A failing New closes what it opened.
//
// Run(ctx) runs the agent, the API, the metrics endpoint and the systemd
// notifier (READY, STATUS, WATCHDOG; notify.go) under one errgroup until
// ctx ends or the agent or the API fails, then shuts down in one order:
//
//  1. systemd STOPPING=1;
//  2. the agent's Run ends: locks released, lease revoked;
//  3. the API and metrics servers stop (they answer until then);
//  4. the bridge and its fence table close;
//  5. the MQTT client disconnects;
//  6. the etcd client closes;
//  7. the twin cache, the outbox and the history files close.
//
// Goroutines: Run starts them all and returns after every one has ended
// and everything is closed; Run is called once. Close is for a daemon
// whose Run never ran. Agent gives tests and benchmarks the agent itself.
package daemon
