package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/agent/daemon"
	"github.com/edgefence/edgefence/internal/sandbox"
)

// etcdCostConfig configures the etcd cost benchmark: what one agent's
// devices cost etcd (issue 17's paper path to 1,000,000 devices).
type etcdCostConfig struct {
	N        int           // devices per agent
	Impls    []string      // "embedded" (3.7, in process), "debian" (/usr/bin/etcd, 3.4)
	Idle     time.Duration // the idle windows
	LeaseTTL time.Duration
	Dir      string
	Log      io.Writer
}

// The etcds the benchmark runs on.
const (
	etcdEmbedded = "embedded"
	etcdDebian   = "debian"
)

// costWait bounds each phase's wait: a takeover of 10,000 devices took
// over 60 s on the loaded 2-core machine.
const costWait = 5 * time.Minute

// etcdSnap is what etcd says at one moment: its revision, its db file,
// and its Prometheus metrics.
type etcdSnap struct {
	At             time.Time
	Rev            int64
	DBSize, DBUsed int64
	M              map[string]float64 // series (name{labels}) → value
}

// sum adds the values of the series named name whose labels contain every
// one of labels (`k="v"`).
func (s etcdSnap) sum(name string, labels ...string) float64 {
	var t float64
	for k, v := range s.M {
		n, l, _ := strings.Cut(k, "{")
		if n != name {
			continue
		}
		ok := true
		for _, x := range labels {
			ok = ok && strings.Contains(l, x)
		}
		if ok {
			t += v
		}
	}
	return t
}

// etcdPhase is the difference between two snapshots.
type etcdPhase struct {
	Name     string
	Per      int // what the figures are divided by (devices); 0 = per second
	Dur      time.Duration
	Revs     int64
	Requests map[string]float64 // gRPC method → unary calls, or stream messages received
	Watchers float64            // the gauge at the end, minus at the start
	Streams  float64            // watch streams, likewise
	Keys     float64            // keys, likewise
	DBSize   int64              // db file, likewise
	DBUsed   int64
	Proposal float64 // raft proposals committed
	RSS      float64 // the etcd process's resident memory at the end (embedded: this whole process)
	Heap     float64 // its Go heap in use at the end
}

// etcdCostResult is one etcd's run.
type etcdCostResult struct {
	Impl, Version string
	N             int
	LeaseTTL      time.Duration
	Phases        []etcdPhase
	// Compacted db size in use after defrag: with one agent holding N
	// devices, then with a second waiting on each.
	Held, HeldWaiting int64
	Base              int64 // the same before any agent
	Takeover          time.Duration
	// The same with bare concurrency.Mutex on two clients: B's Locks
	// all waiting, then A's session revoked → every Lock of B returned.
	BareWait, BareTakeover time.Duration
}

// requestMethods are the gRPC methods counted (the measuring client's
// Status, Compact and Defragment are not).
var requestMethods = []string{"Range", "Put", "DeleteRange", "Txn", "LeaseGrant", "LeaseRevoke", "LeaseTimeToLive", "LeaseLeases", "LeaseKeepAlive", "Watch"}

func diffSnap(name string, per int, a, b etcdSnap) etcdPhase {
	p := etcdPhase{Name: name, Per: per, Dur: b.At.Sub(a.At), Revs: b.Rev - a.Rev, Requests: map[string]float64{},
		DBSize: b.DBSize - a.DBSize, DBUsed: b.DBUsed - a.DBUsed}
	for _, m := range requestMethods {
		name, typ := "grpc_server_handled_total", `grpc_type="unary"`
		if m == "LeaseKeepAlive" || m == "Watch" {
			name, typ = "grpc_server_msg_received_total", `grpc_type="bidi_stream"`
		}
		if d := b.sum(name, `grpc_method="`+m+`"`, typ) - a.sum(name, `grpc_method="`+m+`"`, typ); d != 0 {
			p.Requests[m] = d
		}
	}
	g := func(n string) float64 { return b.sum(n) - a.sum(n) }
	p.Watchers, p.Streams, p.Keys = g("etcd_debugging_mvcc_watcher_total"), g("etcd_debugging_mvcc_watch_stream_total"), g("etcd_debugging_mvcc_keys_total")
	p.Proposal = g("etcd_server_proposals_committed_total")
	p.RSS, p.Heap = b.sum("process_resident_memory_bytes"), b.sum("go_memstats_heap_inuse_bytes")
	return p
}

// etcdUnderTest is one etcd with a way to read its metrics.
type etcdUnderTest struct {
	impl, version string
	endpoints     []string
	cli           *clientv3.Client
	metrics       func(context.Context) (map[string]float64, error)
	close         func()
}

func runEtcdCost(ctx context.Context, embedded *sandbox.Etcd, cfg etcdCostConfig) ([]*etcdCostResult, error) {
	var out []*etcdCostResult
	for _, impl := range cfg.Impls {
		e, err := openEtcdUnderTest(ctx, embedded, impl, filepath.Join(cfg.Dir, "etcdcost-"+impl))
		if err != nil {
			return out, err
		}
		res, err := etcdCostOn(ctx, embedded, e, cfg)
		e.close()
		if res != nil {
			out = append(out, res)
		}
		if err != nil {
			return out, fmt.Errorf("etcdcost on %s: %w", impl, err)
		}
	}
	return out, nil
}

func openEtcdUnderTest(ctx context.Context, embedded *sandbox.Etcd, impl, dir string) (*etcdUnderTest, error) {
	e := &etcdUnderTest{impl: impl}
	switch impl {
	case etcdEmbedded:
		e.endpoints, e.version = embedded.Endpoints(), "3.7.3 (embedded, in this process)"
		e.metrics = func(context.Context) (map[string]float64, error) { return gatherMetrics(prometheus.DefaultGatherer) }
		cli, err := embedded.Client()
		if err != nil {
			return nil, err
		}
		e.cli, e.close = cli, func() { _ = cli.Close() }
	case etcdDebian:
		p, err := sandbox.StartEtcdProc(ctx, sandbox.EtcdProcConfig{Dir: dir, Fast: true})
		if err != nil {
			return nil, err
		}
		v, _ := p.Version()
		e.endpoints, e.version = p.Endpoints(), v+" ("+sandbox.EtcdBinPath+", a subprocess)"
		e.metrics = func(ctx context.Context) (map[string]float64, error) {
			return fetchMetrics(ctx, p.Endpoint()+"/metrics")
		}
		cli, err := p.Client()
		if err != nil {
			_ = p.Close()
			return nil, err
		}
		e.cli, e.close = cli, func() { _ = cli.Close(); _ = p.Close() }
	default:
		return nil, fmt.Errorf("unknown etcd %q (want %s or %s)", impl, etcdEmbedded, etcdDebian)
	}
	return e, nil
}

func (e *etcdUnderTest) snap(ctx context.Context) (etcdSnap, error) {
	st, err := e.cli.Status(ctx, e.endpoints[0])
	if err != nil {
		return etcdSnap{}, err
	}
	m, err := e.metrics(ctx)
	if err != nil {
		return etcdSnap{}, err
	}
	return etcdSnap{At: time.Now(), Rev: st.Header.Revision, DBSize: st.DbSize, DBUsed: st.DbSizeInUse, M: m}, nil
}

// compacted compacts at the current revision, defragments and returns
// the db size in use.
func (e *etcdUnderTest) compacted(ctx context.Context) (int64, error) {
	st, err := e.cli.Status(ctx, e.endpoints[0])
	if err != nil {
		return 0, err
	}
	if _, err := e.cli.Compact(ctx, st.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		return 0, err
	}
	if _, err := e.cli.Defragment(ctx, e.endpoints[0]); err != nil {
		return 0, err
	}
	st, err = e.cli.Status(ctx, e.endpoints[0])
	if err != nil {
		return 0, err
	}
	return st.DbSizeInUse, nil
}

// costRun is one run of the etcd cost benchmark on one etcd.
type costRun struct {
	e    *etcdUnderTest
	cfg  etcdCostConfig
	res  *etcdCostResult
	last etcdSnap
}

// mark snapshots etcd as the start of the next phase.
func (c *costRun) mark(ctx context.Context) (err error) {
	c.last, err = c.e.snap(ctx)
	return err
}

// phase waits for etcd's revision to settle, then records the phase since
// the last mark, per devices (0: per second), and marks.
func (c *costRun) phase(ctx context.Context, name string, per int) error {
	if err := settle(ctx, c.e); err != nil {
		return err
	}
	s, err := c.e.snap(ctx)
	if err != nil {
		return err
	}
	c.res.Phases = append(c.res.Phases, diffSnap(name, per, c.last, s))
	c.last = s
	return nil
}

// idle records an idle window as a phase.
func (c *costRun) idle(ctx context.Context, name string) error {
	fmt.Fprintf(c.cfg.Log, "etcdcost: %s: %s for %v\n", c.e.impl, name, c.cfg.Idle)
	if err := c.mark(ctx); err != nil {
		return err
	}
	select {
	case <-time.After(c.cfg.Idle):
	case <-ctx.Done():
		return ctx.Err()
	}
	s, err := c.e.snap(ctx)
	if err != nil {
		return err
	}
	c.res.Phases = append(c.res.Phases, diffSnap(name, 0, c.last, s))
	c.last = s
	return nil
}

// compacted records the compacted, defragmented db size in use into dst.
func (c *costRun) compacted(ctx context.Context, dst *int64) (err error) {
	*dst, err = c.e.compacted(ctx)
	return err
}

// etcdCostOn runs the phases on e: agent A acquires N devices; idle; agent
// B campaigns for the same N (each waits on A's key); idle; A stops (its
// lease revoked, as its expiry would) and B takes every device over.
func etcdCostOn(ctx context.Context, embedded *sandbox.Etcd, e *etcdUnderTest, cfg etcdCostConfig) (*etcdCostResult, error) {
	c := &costRun{e: e, cfg: cfg, res: &etcdCostResult{Impl: e.impl, Version: e.version, N: cfg.N, LeaseTTL: cfg.LeaseTTL}}
	br, err := sandbox.StartBroker(sandbox.BrokerConfig{})
	if err != nil {
		return nil, err
	}
	defer br.Close()
	devs := deviceIDs("dev-", cfg.N)
	mk := func(gw string) *agentRig {
		ac := agentConfig(gw, filepath.Join(cfg.Dir, "ec-"+e.impl+"-"+gw), embedded, br.URL(), devs)
		ac.Etcd.Endpoints, ac.Etcd.LeaseTTL = e.endpoints, cfg.LeaseTTL
		return &agentRig{cfg: ac, held: &heldCounter{n: int64(cfg.N), all: make(chan struct{})}}
	}
	a, b := mk("gw-a"), mk("gw-b")
	b.cfg.Etcd.Prefix = a.cfg.Etcd.Prefix
	defer a.stop()
	defer b.stop()
	steps := []func() error{
		func() error { return c.compacted(ctx, &c.res.Base) },
		func() error { return c.mark(ctx) },
		func() error { return a.acquire(ctx, c, "A acquires") },
		func() error { return c.compacted(ctx, &c.res.Held) },
		func() error { return c.idle(ctx, "idle: A holding") },
		func() error { return b.await(ctx, c, "B campaigns, waits on A's keys") },
		func() error { return c.compacted(ctx, &c.res.HeldWaiting) },
		func() error { return c.idle(ctx, "idle: A holding, B waiting") },
		func() error { return c.takeover(ctx, a, b, "A stops (lease revoked), B takes over") },
		func() error { return c.bareTakeover(ctx) },
	}
	for _, s := range steps {
		if err := s(); err != nil {
			return c.res, err
		}
	}
	return c.res, nil
}

// agentRig is one in-process agent of the etcd cost benchmark.
type agentRig struct {
	cfg  *agent.Config
	held *heldCounter
	ag   *benchAgent
}

func (r *agentRig) start(ctx context.Context) error {
	var err error
	r.ag, err = startAgent(ctx, r.cfg, daemon.Options{OnHolding: r.held.onHolding})
	return err
}

func (r *agentRig) stop() {
	if r.ag != nil {
		_ = r.ag.stop()
	}
}

// acquire starts r and records the phase until it holds every device.
func (r *agentRig) acquire(ctx context.Context, c *costRun, name string) error {
	fmt.Fprintf(c.cfg.Log, "etcdcost: %s: %s\n", c.e.impl, name)
	if err := r.start(ctx); err != nil {
		return err
	}
	if err := waitClosed(ctx, r.held.all, costWait); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return c.phase(ctx, name, c.cfg.N)
}

// await starts r while another agent holds its devices and records the
// phase until each of its campaigns waits (one more watcher per device).
func (r *agentRig) await(ctx context.Context, c *costRun, name string) error {
	fmt.Fprintf(c.cfg.Log, "etcdcost: %s: %s\n", c.e.impl, name)
	want := c.last.sum("etcd_debugging_mvcc_watcher_total") + float64(c.cfg.N)
	if err := r.start(ctx); err != nil {
		return err
	}
	if err := c.waitWatchers(ctx, want, name); err != nil {
		return err
	}
	return c.phase(ctx, name, c.cfg.N)
}

// takeover stops a (a clean stop revokes its lease: one revoke, as its
// expiry after a kill -9 would be) and records the phase until b holds
// every device.
func (c *costRun) takeover(ctx context.Context, a, b *agentRig, name string) error {
	fmt.Fprintf(c.cfg.Log, "etcdcost: %s: %s\n", c.e.impl, name)
	if err := c.mark(ctx); err != nil {
		return err
	}
	t0 := time.Now()
	a.stop()
	if err := waitClosed(ctx, b.held.all, costWait); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	c.res.Takeover = time.Since(t0)
	return c.phase(ctx, name, c.cfg.N)
}

// bareTakeover is takeover without the agent: client A takes N
// concurrency.Mutex (16 at a time) on one session, client B's N Locks wait
// on them (one goroutine each, as many watchers), A's session is revoked,
// and the phase ends when every Lock of B has returned.
func (c *costRun) bareTakeover(ctx context.Context) error {
	n := c.cfg.N
	fmt.Fprintf(c.cfg.Log, "etcdcost: %s: bare concurrency.Mutex, %d held by A, then waited for and taken over by B\n", c.e.impl, n)
	clis := make([]*clientv3.Client, 2)
	sess := make([]*concurrency.Session, 2)
	for i := range clis {
		cli, err := clientv3.New(clientv3.Config{Endpoints: c.e.endpoints, DialTimeout: 5 * time.Second})
		if err != nil {
			return err
		}
		defer cli.Close()
		if sess[i], err = concurrency.NewSession(cli, concurrency.WithTTL(int(c.cfg.LeaseTTL.Seconds()))); err != nil {
			return err
		}
		defer sess[i].Close()
		clis[i] = cli
	}
	keys := bareKeys(fmt.Sprintf("/bench/etcdcost-bare-%d", time.Now().UnixNano()), n)
	if err := bareLockAll(ctx, sess[0], keys, 16, nil); err != nil {
		return err
	}
	if err := c.mark(ctx); err != nil {
		return err
	}
	t0 := time.Now()
	want := c.last.sum("etcd_debugging_mvcc_watcher_total") + float64(n)
	done := make(chan error, n)
	for _, k := range keys {
		go func() { done <- concurrency.NewMutex(sess[1], k).Lock(ctx) }()
	}
	if err := c.waitWatchers(ctx, want, "bare: B waits"); err != nil {
		return err
	}
	c.res.BareWait = time.Since(t0)
	if err := c.phase(ctx, "bare Mutex: B waits on A's keys", n); err != nil {
		return err
	}
	t0 = time.Now()
	if _, err := clis[0].Revoke(ctx, sess[0].Lease()); err != nil {
		return err
	}
	for range n {
		if err := <-done; err != nil {
			return err
		}
	}
	c.res.BareTakeover = time.Since(t0)
	return c.phase(ctx, "bare Mutex: A's lease revoked, B takes over", n)
}

// bareLockAll takes the mutexes keys on sess, workers at a time, calling
// after (if not nil) with each once it is held.
func bareLockAll(ctx context.Context, sess *concurrency.Session, keys []string, workers int, after func(*concurrency.Mutex) error) error {
	next := make(chan string, len(keys))
	for _, k := range keys {
		next <- k
	}
	close(next)
	errs := make(chan error, workers)
	for range workers {
		go func() {
			for k := range next {
				m := concurrency.NewMutex(sess, k)
				err := m.Lock(ctx)
				if err == nil && after != nil {
					err = after(m)
				}
				if err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	var err error
	for range workers {
		err = errors.Join(err, <-errs)
	}
	return err
}

// bareKeys returns n lock prefixes under pfx.
func bareKeys(pfx string, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s/devices/dev-%04d/lock", pfx, i)
	}
	return keys
}

// waitWatchers waits until etcd has want watchers.
func (c *costRun) waitWatchers(ctx context.Context, want float64, what string) error {
	deadline := time.Now().Add(costWait)
	for {
		s, err := c.e.snap(ctx)
		if err != nil {
			return err
		}
		if s.sum("etcd_debugging_mvcc_watcher_total") >= want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: %v of %v watchers after %v", what, s.sum("etcd_debugging_mvcc_watcher_total"), want, costWait)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func waitClosed(ctx context.Context, ch <-chan struct{}, limit time.Duration) error {
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(limit):
		return fmt.Errorf("not done within %v", limit)
	}
}

// settle waits until etcd's revision has not moved for 500 ms.
func settle(ctx context.Context, e *etcdUnderTest) error {
	last, since := int64(-1), time.Now()
	for time.Since(since) < 500*time.Millisecond {
		st, err := e.cli.Status(ctx, e.endpoints[0])
		if err != nil {
			return err
		}
		if st.Header.Revision != last {
			last, since = st.Header.Revision, time.Now()
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}

func gatherMetrics(g prometheus.Gatherer) (map[string]float64, error) {
	mfs, err := g.Gather()
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	enc := expfmt.NewEncoder(&buf, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range mfs {
		if err := enc.Encode(mf); err != nil {
			return nil, err
		}
	}
	return parseMetrics(&buf)
}

func fetchMetrics(ctx context.Context, url string) (map[string]float64, error) {
	body, err := httpGet(ctx, url)
	if err != nil {
		return nil, err
	}
	defer body.Close()
	return parseMetrics(body)
}

// parseMetrics reads the Prometheus text format's samples: series → value.
func parseMetrics(r io.Reader) (map[string]float64, error) {
	m := map[string]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if l == "" || l[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(l, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(l[i+1:], 64)
		if err != nil {
			continue
		}
		m[l[:i]] = v
	}
	return m, sc.Err()
}

func printEtcdCost(w io.Writer, results []*etcdCostResult) {
	for _, r := range results {
		fmt.Fprintf(w, "### etcd cost of one agent's devices: etcd %s, %d devices, lease TTL %v\n\n", r.Version, r.N, r.LeaseTTL)
		fmt.Fprintln(w, "Per device (phases of acquisition, waiting, takeover) or per second (idle windows); requests are gRPC unary calls, or messages received on the LeaseKeepAlive and Watch streams.")
		fmt.Fprintln(w)
		fmt.Fprintln(w, "| phase | per | duration s | revisions | requests (by method) | watchers Δ | watch streams Δ | keys Δ | db size Δ B | db in use Δ B | raft proposals | at the end: RSS / Go heap in use MiB |")
		fmt.Fprintln(w, "|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|")
		for _, p := range r.Phases {
			div, per := float64(p.Per), "device"
			if p.Per == 0 {
				div, per = p.Dur.Seconds(), "second"
			}
			var reqs []string
			var total float64
			for _, m := range requestMethods {
				if v, ok := p.Requests[m]; ok {
					reqs = append(reqs, fmt.Sprintf("%s %.3g", m, v/div))
					total += v
				}
			}
			fmt.Fprintf(w, "| %s | %s | %.2f | %.4g | %.4g: %s | %.3g | %.3g | %.3g | %.0f | %.0f | %.4g | %.1f / %.1f |\n", p.Name, per, p.Dur.Seconds(),
				float64(p.Revs)/div, total/div, strings.Join(reqs, ", "), p.Watchers/div, p.Streams, p.Keys/div,
				float64(p.DBSize)/div, float64(p.DBUsed)/div, p.Proposal/div, p.RSS/(1<<20), p.Heap/(1<<20))
		}
		fmt.Fprintln(w)
		n := float64(r.N)
		fmt.Fprintf(w, "- compacted and defragmented, db in use: %d B before any agent; %d B with A holding %d (**%.0f B per held lock key**); %d B with B waiting on each too (**%.0f B per waiting key**)\n",
			r.Base, r.Held, r.N, float64(r.Held-r.Base)/n, r.HeldWaiting, float64(r.HeldWaiting-r.Held)/n)
		fmt.Fprintf(w, "- takeover: A's clean stop → B holds all %d: %s ms; bare concurrency.Mutex: %d Locks waiting after %s ms, all returned %s ms after A's revoke\n\n",
			r.N, ms(r.Takeover), r.N, ms(r.BareWait), ms(r.BareTakeover))
	}
}
