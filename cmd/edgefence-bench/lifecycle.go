package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/devices/sim"
	"github.com/edgefence/edgefence/internal/sandbox"
)

// lifecycleConfig configures the cold start and clean shutdown benchmark.
type lifecycleConfig struct {
	Sizes    []int
	Runs     int
	AgentBin string // empty: build ./cmd/edgefence
	Dir      string
	Log      io.Writer
}

// lifecycleRun is one start and stop of the agent; times are from exec
// (Ready, Held) or from SIGTERM (Stopping, KeysGone, Exit).
type lifecycleRun struct {
	Ready    time.Duration // READY=1 received on NOTIFY_SOCKET
	Held     time.Duration // every device's lock key in etcd
	Holding  time.Duration // the agent's status: every device held (token read, recorded in the outbox)
	Stopping time.Duration // STOPPING=1 received
	KeysGone time.Duration // the last lock key's delete seen by a watch
	Exit     time.Duration // the process has exited (wait returned)
	Code     int           // exit code
	LeftKeys int           // lock keys in etcd right after the exit
	LeaseTTL int64         // TimeToLive of the agent's lease right after the exit (-1: revoked)

	// From the agent's log (slog text, millisecond timestamps): from exec
	// (Starting, Session) or from SIGTERM (Released, Stopped); -1 if absent.
	Starting, Session, Released, Stopped time.Duration
}

type lifecycleSize struct {
	Devices int
	Runs    []lifecycleRun
}

type lifecycleResult struct {
	Built string
	Sizes []lifecycleSize
}

func runLifecycle(ctx context.Context, etcd *sandbox.Etcd, cfg lifecycleConfig) (*lifecycleResult, error) {
	built, err := buildMissing(ctx, cfg.Dir, cfg.Log, benchBin{"edgefence", &cfg.AgentBin})
	if err != nil {
		return nil, err
	}
	res := &lifecycleResult{Built: cmp.Or(built, "given with --agent-bin")}
	br, cli, done, err := startMochiAndClient(ctx, etcd, cfg.Dir)
	if err != nil {
		return nil, err
	}
	defer done()
	for _, n := range cfg.Sizes {
		sz, err := lifecycleSizeRun(ctx, etcd, cli, br, n, cfg)
		if sz != nil && len(sz.Runs) > 0 {
			res.Sizes = append(res.Sizes, *sz)
		}
		if err != nil {
			return res, fmt.Errorf("lifecycle with %d devices: %w", n, err)
		}
	}
	return res, nil
}

func lifecycleSizeRun(ctx context.Context, etcd *sandbox.Etcd, cli *clientv3.Client, br *broker, n int, cfg lifecycleConfig) (*lifecycleSize, error) {
	sz := &lifecycleSize{Devices: n}
	dir := filepath.Join(cfg.Dir, fmt.Sprintf("lifecycle-%d", n))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	devs := deviceIDs("lc-", n)
	mqttPrefix := fmt.Sprintf("lc%d", n)
	_, closeFleet, err := startFleet(ctx, dir, br.url, mqttPrefix, "bench-lc-fleet-"+mqttPrefix, devs, 60*time.Second, fleetAuth{})
	if err != nil {
		return nil, err
	}
	defer closeFleet()
	etcdPrefix := fmt.Sprintf("/bench/lc-%d-%d", n, time.Now().UnixNano())
	c := sandbox.AgentConfig{Gateway: fmt.Sprintf("bench-lc-%d", n), Etcd: etcd.Endpoint(), MQTT: br.url, Devices: devs,
		Socket: filepath.Join(dir, "agent.sock"), StateDir: filepath.Join(dir, "state"),
		EtcdPrefix: etcdPrefix, MQTTPrefix: mqttPrefix, ClientID: fmt.Sprintf("bench-lc-agent-%d", n),
		LeaseTTL: 10 * time.Second, LogLevel: "info", LogFormat: "text"}
	cpath := filepath.Join(dir, "edgefence.yaml")
	if err := c.Write(cpath); err != nil {
		return nil, err
	}
	// Run 0 leaves local state behind (outbox.db with a held token and an
	// accepted command per device), as a previous run on a gateway would.
	for k := 0; k <= cfg.Runs; k++ {
		if k == 0 {
			fmt.Fprintf(cfg.Log, "lifecycle: %d devices: first run, leaving local state\n", n)
		} else {
			fmt.Fprintf(cfg.Log, "lifecycle: %d devices: run %d/%d\n", n, k, cfg.Runs)
		}
		r, err := lifecycleOnce(ctx, cli, etcdPrefix, n, cpath, c.Socket, filepath.Join(dir, fmt.Sprintf("notify-%d.sock", k)),
			filepath.Join(dir, "agent.log"), cfg.AgentBin, func() error {
				if k > 0 {
					return nil
				}
				api := agent.NewAPIClient(c.Socket)
				return sendEach(ctx, api, devs, 8)
			})
		if err != nil {
			return sz, err
		}
		if k > 0 {
			fmt.Fprintf(cfg.Log, "lifecycle: READY %s ms, all held %s ms (agent %s ms); SIGTERM → exit %s ms, keys gone %s ms, %d keys left, lease TTL %d, exit %d\n",
				ms(r.Ready), ms(r.Held), ms(r.Holding), ms(r.Exit), ms(r.KeysGone), r.LeftKeys, r.LeaseTTL, r.Code)
			sz.Runs = append(sz.Runs, r)
		}
	}
	return sz, nil
}

// sendEach sends one accepted set command to every device, workers at a time.
func sendEach(ctx context.Context, api *agent.APIClient, devs []string, workers int) error {
	jobs := make(chan string)
	errc := make(chan error, workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for d := range jobs {
				r, err := api.Send(ctx, d, sim.KindSet, json.RawMessage(`{"setpoint": 21}`))
				if err == nil && (r == nil || r.Verdict != "accepted") {
					err = fmt.Errorf("send to %s: %+v", d, r)
				}
				if err != nil {
					select {
					case errc <- err:
					default:
					}
				}
			}
		})
	}
	for _, d := range devs {
		jobs <- d
	}
	close(jobs)
	wg.Wait()
	select {
	case err := <-errc:
		return err
	default:
		return nil
	}
}

// notifyListener receives sd_notify datagrams on a unixgram socket, as
// systemd does, and timestamps the first of each state.
type notifyListener struct {
	conn *net.UnixConn
	mu   sync.Mutex
	seen map[string]time.Time
	got  chan struct{} // a datagram arrived
	done chan struct{}
}

func listenNotify(path string) (*notifyListener, error) {
	_ = os.Remove(path)
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		return nil, err
	}
	l := &notifyListener{conn: conn, seen: map[string]time.Time{}, got: make(chan struct{}, 1), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		buf := make([]byte, 4096)
		for {
			n, _, err := conn.ReadFromUnix(buf)
			if err != nil {
				return
			}
			at := time.Now()
			l.mu.Lock()
			for _, line := range strings.Split(string(buf[:n]), "\n") {
				if k, _, ok := strings.Cut(line, "="); ok && k != "STATUS" {
					if _, dup := l.seen[line]; !dup {
						l.seen[line] = at
					}
				}
			}
			l.mu.Unlock()
			select {
			case l.got <- struct{}{}:
			default:
			}
		}
	}()
	return l, nil
}

// wait returns when state (e.g. "READY=1") was first received.
func (l *notifyListener) wait(ctx context.Context, state string, exited <-chan struct{}) (time.Time, error) {
	for {
		l.mu.Lock()
		at, ok := l.seen[state]
		l.mu.Unlock()
		if ok {
			return at, nil
		}
		select {
		case <-l.got:
		case <-exited:
			return time.Time{}, fmt.Errorf("agent exited before %s", state)
		case <-ctx.Done():
			return time.Time{}, fmt.Errorf("no %s: %w", state, ctx.Err())
		}
	}
}

func (l *notifyListener) close() {
	_ = l.conn.Close()
	<-l.done
}

// lifecycleOnce starts the agent with NOTIFY_SOCKET, times READY and all
// held, runs between (or nil), then sends SIGTERM and times the exit and the
// release of the lock keys in etcd.
func lifecycleOnce(ctx context.Context, cli *clientv3.Client, etcdPrefix string, n int, cpath, apiSock, sockPath, logPath, bin string, between func() error) (lifecycleRun, error) {
	o := &lifecycleProc{cli: cli, etcdPrefix: etcdPrefix, n: n, logPath: logPath}
	var err error
	if o.nl, err = listenNotify(sockPath); err != nil {
		return o.r, err
	}
	defer o.nl.close()
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return o.r, err
	}
	defer logf.Close()
	logStart, err := logf.Seek(0, io.SeekEnd)
	if err != nil {
		return o.r, err
	}
	if err := o.start(bin, cpath, sockPath, logf); err != nil {
		return o.r, err
	}
	defer o.kill()
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	lease, err := o.awaitHeld(wctx, apiSock)
	if err != nil {
		return o.r, err
	}
	if between != nil {
		if err := between(); err != nil {
			return o.r, err
		}
	}
	tTerm, err := o.terminate(ctx, wctx, lease)
	if err != nil {
		return o.r, err
	}
	o.readLog(logStart, tTerm)
	var ee *exec.ExitError
	if errors.As(o.waitErr, &ee) {
		o.r.Code = ee.ExitCode()
	} else if o.waitErr != nil {
		return o.r, o.waitErr
	}
	return o.r, nil
}

// lifecycleProc is the agent subprocess of one lifecycleOnce, what it is
// watched through, and the figures taken so far.
type lifecycleProc struct {
	cli        *clientv3.Client
	etcdPrefix string
	n          int // devices
	logPath    string
	nl         *notifyListener

	cmd     *exec.Cmd
	t0      time.Time     // exec
	exited  chan struct{} // closed when the process has exited; then:
	exitAt  time.Time
	waitErr error

	r lifecycleRun
}

// start execs the agent with its output appended to logf.
func (o *lifecycleProc) start(bin, cpath, sockPath string, logf *os.File) error {
	o.cmd = exec.Command(bin, "run", "--config", cpath)
	o.cmd.Stdout, o.cmd.Stderr = logf, logf
	o.cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+sockPath)
	o.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	o.t0 = time.Now()
	if err := o.cmd.Start(); err != nil {
		return err
	}
	o.exited = make(chan struct{})
	go func() {
		o.waitErr = o.cmd.Wait()
		o.exitAt = time.Now()
		close(o.exited)
	}()
	return nil
}

// kill kills the agent if it still runs and waits for it.
func (o *lifecycleProc) kill() {
	select {
	case <-o.exited:
	default:
		_ = o.cmd.Process.Kill()
		<-o.exited
	}
}

// poll calls done every period until it returns true; what names the
// condition for the error if ctx ends first.
func (o *lifecycleProc) poll(ctx context.Context, period time.Duration, what string, done func() bool) error {
	for !done() {
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w (log %s)", what, ctx.Err(), o.logPath)
		case <-o.exited:
			return fmt.Errorf("agent exited (log %s)", o.logPath)
		case <-time.After(period):
		}
	}
	return nil
}

// awaitHeld times READY=1, every lock key in etcd and the agent's status
// saying it holds every device; it returns the lease of the lock keys.
func (o *lifecycleProc) awaitHeld(ctx context.Context, apiSock string) (lease int64, err error) {
	ready, err := o.nl.wait(ctx, "READY=1", o.exited)
	if err != nil {
		return 0, fmt.Errorf("%w (log %s)", err, o.logPath)
	}
	o.r.Ready = ready.Sub(o.t0)
	err = o.poll(ctx, 5*time.Millisecond, fmt.Sprintf("not all %d devices held", o.n), func() bool {
		g, err := o.cli.Get(ctx, o.etcdPrefix+"/devices/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err != nil {
			return false
		}
		k := 0
		for _, kv := range g.Kvs {
			if strings.Contains(string(kv.Key), "/lock/") {
				k++
				lease = kv.Lease
			}
		}
		if k >= o.n {
			o.r.Held = time.Since(o.t0)
		}
		return k >= o.n
	})
	if err != nil {
		return 0, err
	}
	// The keys exist a moment before the agent holds: wait for its status,
	// so that SIGTERM finds a holder, not an acquisition in progress.
	api := agent.NewAPIClient(apiSock)
	err = o.poll(ctx, 10*time.Millisecond, fmt.Sprintf("agent does not hold all %d devices", o.n), func() bool {
		if st, err := api.Status(ctx); err == nil && st.Counters.Acquired >= uint64(o.n) {
			o.r.Holding = time.Since(o.t0)
			return true
		}
		return false
	})
	return lease, err
}

// terminate sends SIGTERM and times the exit, the deletes of the lock keys
// and STOPPING=1 from it (returned as tTerm); right after the exit it reads
// the lock keys left in etcd and the TimeToLive of lease. wctx bounds the
// watch and the wait for STOPPING.
func (o *lifecycleProc) terminate(ctx, wctx context.Context, lease int64) (tTerm time.Time, err error) {
	gone, err := o.watchRelease(ctx, wctx)
	if err != nil {
		return tTerm, err
	}
	time.Sleep(100 * time.Millisecond) // let the watch start
	tTerm = time.Now()
	if err := o.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return tTerm, err
	}
	select {
	case <-o.exited:
	case <-time.After(20 * time.Second):
		return tTerm, fmt.Errorf("no exit 20 s after SIGTERM (log %s)", o.logPath)
	}
	o.r.Exit = o.exitAt.Sub(tTerm)
	// Right after the exit: what is left in etcd.
	if o.r.LeftKeys, err = countLockKeys(ctx, o.cli, o.etcdPrefix); err != nil {
		return tTerm, err
	}
	ttl, err := o.cli.TimeToLive(ctx, clientv3.LeaseID(lease))
	if err != nil {
		return tTerm, err
	}
	o.r.LeaseTTL = ttl.TTL
	select {
	case at := <-gone:
		o.r.KeysGone = at.Sub(tTerm)
	case <-time.After(5 * time.Second):
		o.r.KeysGone = -1
	}
	if at, err := o.nl.wait(wctx, "STOPPING=1", nil); err == nil {
		o.r.Stopping = at.Sub(tTerm)
	}
	return tTerm, nil
}

// watchRelease watches the lock keys (until wctx ends) and returns a
// channel that receives the time the last one's delete was seen: the
// release as etcd applies it (per-key unlocks, then the lease revoke).
func (o *lifecycleProc) watchRelease(ctx, wctx context.Context) (<-chan time.Time, error) {
	g, err := o.cli.Get(ctx, o.etcdPrefix+"/devices/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return nil, err
	}
	wch := o.cli.Watch(wctx, o.etcdPrefix+"/devices/", clientv3.WithPrefix(), clientv3.WithRev(g.Header.Revision+1))
	gone := make(chan time.Time, 1)
	go func() {
		left := 0
		for _, kv := range g.Kvs {
			if strings.Contains(string(kv.Key), "/lock/") {
				left++
			}
		}
		for wr := range wch {
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypeDelete && strings.Contains(string(ev.Kv.Key), "/lock/") {
					left--
				}
			}
			if left <= 0 {
				gone <- time.Now()
				return
			}
		}
	}()
	return gone, nil
}

// readLog takes the times of the agent's start and stop messages from what
// it logged from logStart on (-1 for those missing).
func (o *lifecycleProc) readLog(logStart int64, tTerm time.Time) {
	o.r.Starting, o.r.Session, o.r.Released, o.r.Stopped = -1, -1, -1, -1
	b, err := os.ReadFile(o.logPath)
	if err != nil || int64(len(b)) < logStart {
		return
	}
	for _, l := range strings.Split(string(b[logStart:]), "\n") {
		at, msg, ok := slogLine(l)
		if !ok {
			continue
		}
		switch msg {
		case "edgefence starting":
			o.r.Starting = at.Sub(o.t0)
		case "etcd session open":
			o.r.Session = at.Sub(o.t0)
		case "released locks":
			o.r.Released = at.Sub(tTerm)
		case "edgefence stopped":
			o.r.Stopped = at.Sub(tTerm)
		}
	}
}

// slogLine returns the time and msg of a slog text line.
func slogLine(l string) (time.Time, string, bool) {
	ts, ok := strings.CutPrefix(l, "time=")
	if !ok {
		return time.Time{}, "", false
	}
	ts, rest, _ := strings.Cut(ts, " ")
	at, err := time.Parse(time.RFC3339Nano, ts)
	if err != nil {
		return time.Time{}, "", false
	}
	_, m, ok := strings.Cut(rest, "msg=")
	if !ok {
		return time.Time{}, "", false
	}
	if strings.HasPrefix(m, `"`) {
		if end := strings.Index(m[1:], `"`); end >= 0 {
			return at, m[1 : end+1], true
		}
		return time.Time{}, "", false
	}
	m, _, _ = strings.Cut(m, " ")
	return at, m, true
}

func printLifecycle(w io.Writer, r *lifecycleResult) {
	fmt.Fprintf(w, "### Cold start and clean shutdown: `edgefence run` subprocess with existing local state (%s)\n\n", r.Built)
	fmt.Fprintln(w, "Start: exec → READY=1 on NOTIFY_SOCKET, and → every lock key in etcd. Stop: SIGTERM → STOPPING=1, → the last lock key's delete seen by an etcd watch, → process exit; then the lock keys left in etcd and the lease's TimeToLive (-1: revoked).")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| devices | runs | READY p50 / max ms | all keys in etcd p50 / max ms | agent holds all p50 / max ms | SIGTERM → STOPPING p50 ms | → keys gone p50 / max ms | → exit p50 / max ms | keys left after exit | lease after exit | exit codes | READY ≤ 300 ms (max) | exit ≤ 1 s (max) |")
	fmt.Fprintln(w, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|---|")
	for _, s := range r.Sizes {
		var ready, held, holding, stop, gone, exit []time.Duration
		left, revoked := 0, 0
		codes := map[int]int{}
		for _, x := range s.Runs {
			ready, held, stop, gone, exit = append(ready, x.Ready), append(held, x.Held), append(stop, x.Stopping), append(gone, x.KeysGone), append(exit, x.Exit)
			holding = append(holding, x.Holding)
			left += x.LeftKeys
			if x.LeaseTTL == -1 {
				revoked++
			}
			codes[x.Code]++
		}
		var cs []string
		for c, k := range codes {
			cs = append(cs, fmt.Sprintf("%d×%d", k, c))
		}
		fmt.Fprintf(w, "| %d | %d | %s / %s | %s / %s | %s / %s | %s | %s / %s | %s / %s | %d | revoked in %d/%d | %s | **%s** | **%s** |\n",
			s.Devices, len(s.Runs), ms(median(ready)), ms(slicesMax(ready)), ms(median(held)), ms(slicesMax(held)), ms(median(holding)), ms(slicesMax(holding)), ms(median(stop)),
			ms(median(gone)), ms(slicesMax(gone)), ms(median(exit)), ms(slicesMax(exit)), left, revoked, len(s.Runs), strings.Join(cs, ", "),
			metOrNot(slicesMax(ready) <= 300*time.Millisecond), metOrNot(slicesMax(exit) <= time.Second && left == 0 && revoked == len(s.Runs)))
	}
	fmt.Fprintln(w)
	for _, s := range r.Sizes {
		var each []string
		for _, x := range s.Runs {
			each = append(each, fmt.Sprintf("%s/%s", ms(x.Ready), ms(x.Exit)))
		}
		fmt.Fprintf(w, "- %d devices, each run READY/exit ms: %s\n", s.Devices, strings.Join(each, ", "))
		var st, se, rl, sp []time.Duration
		for _, x := range s.Runs {
			st, se, rl, sp = append(st, x.Starting), append(se, x.Session), append(rl, x.Released), append(sp, x.Stopped)
		}
		fmt.Fprintf(w, "- %d devices, from the agent's log (ms timestamps), medians: exec → \"edgefence starting\" (config, state opened, clients built) %s ms, → \"etcd session open\" %s ms; SIGTERM → \"released locks\" (lease revoked) %s ms, → \"edgefence stopped\" %s ms\n",
			s.Devices, ms(median(st)), ms(median(se)), ms(median(rl)), ms(median(sp)))
	}
	fmt.Fprintln(w)
}
