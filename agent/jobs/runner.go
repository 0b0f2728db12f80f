package jobs

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/edgefence/edgefence/fence"
)

// The runner: this gateway's side of the firmware jobs of the devices it
// holds.
//
//	Store.Watch ─▶ kick the workers of the held devices the job selects
//	Acquired(dev) (lease hook) ─▶ start dev's worker (or kick it)
//	Report(dev, fw) (state report) ─▶ latest report of dev; kick its worker
//	worker(dev), while Holding(dev):
//	  the first job selecting dev (creation order) whose execution is live:
//	  Queue (if absent) → Start (rollout decides) → drive it from the
//	  device's report: fw.begin, fw.chunk…, fw.install, fw.activate,
//	  fw.commit — each a fenced command through Host.Issue, the chunks a
//	  window of them ahead of the device's acks — and Update the
//	  execution (fenced by the holder's lock key) → Finish
//	  a stale ack or ErrFenced: this gateway is deposed; the worker stops
//	  and the new holder resumes from the device's report.
//
// A worker runs per held device, owned by Run: Run returns only after
// every worker it started has returned.

// Host is what the runner needs of the agent: who holds a device, and the
// fenced command path (Agent.Issue: the durable outbox, MQTT).
type Host interface {
	// Holding returns the device's lock key and token now, if this
	// gateway holds it.
	Holding(dev string) (Holder, bool)
	// IssueAll issues fenced commands of one kind to dev, in order,
	// stored durably in dev's queue in one commit (one fsync for a
	// download's chunks), all or none, without waiting for the device:
	// the device's worker delivers dev's commands one at a time in the
	// order issued. Not holding dev is ErrFenced.
	IssueAll(ctx context.Context, dev, kind string, bodies [][]byte) ([]Pending, error)
}

// Pending is a command Host.Issue issued (agent.Pending).
type Pending interface {
	// Wait waits for the device's ack (at most the host's command
	// timeout); the error is the ack's (fence.ErrStale, fence.ErrInvalid,
	// …) when one arrived.
	Wait(ctx context.Context) (*fence.Ack, error)
	// Close stops waiting; the command stays queued.
	Close()
}

// Images gives the runner a job's image (agent/images implements it over
// the gateway's content-addressed cache).
type Images interface {
	Get(ctx context.Context, ref ImageRef) (Image, error)
}

// Image is one image, read at offsets; Close releases it.
type Image interface {
	Size() uint64
	ReadAt(p []byte, off int64) (int, error)
	Close() error
}

// ImagesFunc adapts a function to Images.
type ImagesFunc func(ctx context.Context, ref ImageRef) (Image, error)

// Get calls f.
func (f ImagesFunc) Get(ctx context.Context, ref ImageRef) (Image, error) { return f(ctx, ref) }

// Executions is what the runner needs of the Store (*Store implements it).
type Executions interface {
	Jobs(ctx context.Context) ([]Job, error)
	Rollout(ctx context.Context, id string) (Rollout, error)
	Execution(ctx context.Context, dev, job string) (Execution, error)
	Queue(ctx context.Context, dev, job string, h Holder) (Execution, error)
	Start(ctx context.Context, e Execution, h Holder) (Execution, error)
	Update(ctx context.Context, e Execution, h Holder) (Execution, error)
	Finish(ctx context.Context, e Execution, to Status, reason string, h Holder) (Execution, Rollout, error)
	Watch(ctx context.Context) <-chan Change
}

// RunnerConfig configures a Runner.
type RunnerConfig struct {
	Gateway string
	// Devices are this gateway's configured devices: the runner keeps the
	// latest firmware report of each, and drives jobs for those it holds.
	Devices []string
	Logger  *slog.Logger     // nil: none
	Now     func() time.Time // nil: time.Now
	// Window is how many fw.chunk commands the runner keeps issued ahead
	// of the device's ack (so that the outbox's appends overlap the
	// device's work); zero: DefaultWindow; at most MaxWindow; 1: each
	// chunk waits for the previous one's ack.
	Window int
	// Retry is the wait before a failed etcd read or write is tried
	// again, and before a queued execution asks the rollout again without
	// a RetryAfter; zero: DefaultRetry.
	Retry time.Duration
}

// DefaultRetry is RunnerConfig.Retry's default.
const DefaultRetry = 2 * time.Second

// DefaultWindow and MaxWindow bound RunnerConfig.Window.
const (
	DefaultWindow = 16
	MaxWindow     = 32
)

// Runner drives the firmware jobs of the devices this gateway holds.
// Create it with NewRunner, run it with Run; Acquired and Report are safe
// to call at any time, from any goroutine.
type Runner struct {
	store  Executions
	images Images
	host   Host
	cfg    RunnerConfig
	log    *slog.Logger
	known  map[string]bool

	mu      sync.Mutex
	ctx     context.Context // set while Run runs; nil: no new workers
	workers map[string]*worker
	reports map[string]fwReport
	waits   map[string]*places // by job: the workers waiting for a place in its rollout
	seq     uint64             // numbers the reports, for "newer than"
	wg      sync.WaitGroup
	lister  jobLister // the workers' listings of the jobs, shared

	stats runnerStats
}

// NewRunner returns a runner over store, images and host.
func NewRunner(store Executions, images Images, host Host, cfg RunnerConfig) *Runner {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Retry <= 0 {
		cfg.Retry = DefaultRetry
	}
	if cfg.Window <= 0 {
		cfg.Window = DefaultWindow
	}
	cfg.Window = min(cfg.Window, MaxWindow)
	r := &Runner{store: store, images: images, host: host, cfg: cfg, log: cfg.Logger.With("component", "jobs"),
		known: make(map[string]bool, len(cfg.Devices)), workers: make(map[string]*worker),
		reports: make(map[string]fwReport), waits: make(map[string]*places)}
	for _, d := range cfg.Devices {
		r.known[d] = true
	}
	r.stats.init()
	return r
}

// Run watches the jobs and rollouts until ctx ends, kicking the workers of
// the held devices on every change, then waits for the workers.
func (r *Runner) Run(ctx context.Context) error {
	r.mu.Lock()
	r.ctx = ctx
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.ctx = nil
		r.mu.Unlock()
		r.wg.Wait()
	}()
	ch := r.store.Watch(ctx)
	r.kickHeld() // jobs created before the watch
	seen := watched{jobs: make(map[string]Job), rollouts: make(map[string]rolloutAt)}
	for {
		select {
		case <-ctx.Done():
			return nil
		case c, ok := <-ch:
			if !ok {
				return nil // ctx ended: the watch closes its channel
			}
			r.changed(seen, c)
		}
	}
}

// watched is what Run's watch delivered: the job documents and the
// latest rollout of each job (with its revision); only Run uses it.
type watched struct {
	jobs     map[string]Job
	rollouts map[string]rolloutAt
}

type rolloutAt struct {
	ro  Rollout
	rev int64
}

// changed kicks the workers of the held devices a change concerns: those
// its job selects (every held device while the job document is unknown).
// A change of an active or paused rollout wakes only the workers waiting
// for a place that it has places for (offer): the others have nothing to
// do with it (a worker driving an execution only looks for a stopping
// rollout). Job documents and rollouts come on two watch streams: a
// rollout of a job whose document has not come yet wakes none, and the
// document's arrival kicks every worker but those waiting in its rollout
// already, and offers the places of its latest rollout. A job document
// never changes (it comes again after a lost watch).
func (r *Runner) changed(seen watched, c Change) {
	r.stats.changed()
	switch {
	case c.Job != nil:
		seen.jobs[c.ID] = *c.Job
	case c.Deleted && c.Doc == DocJob:
		delete(seen.jobs, c.ID)
	case c.Deleted:
		delete(seen.rollouts, c.ID)
	}
	j, known := seen.jobs[c.ID]
	if ro := c.Rollout; ro != nil {
		seen.rollouts[c.ID] = rolloutAt{*ro, c.Rev}
		if ro.Status == RolloutActive || ro.Status == RolloutPaused {
			if known {
				r.offer(j, *ro, c.Rev)
			}
			return
		}
		r.forgetPlaces(c.ID)
	}
	for _, d := range r.cfg.Devices {
		if known && !j.Selects(d) {
			continue
		}
		if _, ok := r.host.Holding(d); ok && !(c.Job != nil && r.waitsOn(d, c.ID)) {
			r.kick(d, true)
		}
	}
	if ra, ok := seen.rollouts[c.ID]; ok && c.Job != nil && (ra.ro.Status == RolloutActive || ra.ro.Status == RolloutPaused) {
		r.offer(j, ra.ro, ra.rev)
	}
}

// kickHeld starts (or kicks) the worker of every device this gateway
// holds, telling them the jobs or rollouts changed.
func (r *Runner) kickHeld() {
	for _, d := range r.cfg.Devices {
		if _, ok := r.host.Holding(d); ok {
			r.kick(d, true)
		}
	}
}

// Acquired is the lease hook: this gateway now holds dev (a new token, or
// the same one resumed): its worker starts, or plans again.
func (r *Runner) Acquired(dev string) { r.kick(dev, true) }

// Report takes the "fw" field of dev's state report (nil: none). The
// latest is kept for every configured device, held or not, so that a
// gateway taking a device over has its last report.
func (r *Runner) Report(dev string, fw map[string]any) {
	if !r.known[dev] || fw == nil {
		return
	}
	rep, err := parseReport(fw)
	if err != nil {
		r.stats.badReport()
		r.log.Warn("firmware report malformed; ignored", "device", dev, "err", err)
		return
	}
	r.mu.Lock()
	r.seq++
	rep.seq = r.seq
	r.reports[dev] = rep
	w := r.workers[dev]
	r.mu.Unlock()
	if w != nil && w.driving.Load() {
		w.poke(false)
	}
}

// report returns dev's latest firmware report (ok false: none yet).
func (r *Runner) report(dev string) (fwReport, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rep, ok := r.reports[dev]
	return rep, ok
}

// kick starts dev's worker if it does not run (and Run runs), or wakes
// it; changed says the jobs or rollouts may have changed.
func (r *Runner) kick(dev string, changed bool) {
	if !r.known[dev] {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	w := r.workers[dev]
	if w != nil {
		w.poke(changed)
		return
	}
	if r.ctx == nil || r.ctx.Err() != nil {
		return
	}
	w = &worker{r: r, dev: dev, kicks: make(chan struct{}, 1), log: r.log.With("device", dev)}
	r.workers[dev] = w
	ctx := r.ctx
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		w.run(ctx)
	}()
}

// exit removes w unless it was kicked meanwhile (then it goes on).
func (r *Runner) exit(w *worker) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	select {
	case <-w.kicks:
		return false
	default:
	}
	delete(r.workers, w.dev)
	return true
}
