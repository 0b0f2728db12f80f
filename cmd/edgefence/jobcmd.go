package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/edgefence/edgefence/agent/jobs"
)

const jobUsage = `usage: edgefence job <command> [flags]

Firmware jobs in etcd, directly (no agent needed): a job document names an
image and its target devices; its rollout (active, paused, canceled, aborted,
completed) bounds how many devices run it at once and how fast, starts
canaries first and aborts on failures; the gateways holding the devices run
it and record each device's execution.

commands:
  create [etcd flags] --id ID (--image FILE | --sha256 HEX --size N --url URL) --version N
         [--name NAME] [--url URL] [--manifest FILE] [--devices a,b] [--match 'fw-*,…']
         [--max-concurrent N] [--per-minute N] [--canary N] [--abort-ratio R --abort-min N]
         [--chunk BYTES] [--step-timeout D] [--reboot-timeout D] [--total-timeout D] [--json]
                                 store a new job and start its rollout; --image hashes
                                 the file and (without --url) serves it as file://PATH
  create [etcd flags] --file JOB.json [--json]
                                 the same from a job document (JSON, as show --json prints)
  list   [etcd flags] [--json]   every job: rollout status, counts per execution status, image
  show   [etcd flags] [--json] [--watch] ID
                                 the job, its rollout and every device's execution (status,
                                 step, bytes, gateway, token, reason); --watch redraws on every
                                 change until Ctrl-C (--json: one object per line)
  pause  [etcd flags] [--reason TEXT] ID    no new device starts; those in progress go on
  resume [etcd flags] [--reason TEXT] ID    a paused rollout goes on
  cancel [etcd flags] [--reason TEXT] ID    no new device starts; devices in progress are
                                            canceled (they roll back where they can)

etcd flags: --config FILE | --etcd URL[,URL] [--prefix P]   (and --timeout D)
With --config (default ` + defaultConfig + ` unless --etcd is given) etcd.endpoints and
etcd.prefix come from the file; --etcd and --prefix override them.

Exit status: 0 done; 1 error (invalid job: nothing written; a job with that id
exists; no such job; a status change the rollout does not allow — canceled,
aborted and completed are ends; etcd unreachable); 2 usage.
`

func cmdJob(args []string, stdout, stderr io.Writer) error {
	return subcommand("job", jobUsage, map[string]command{
		"create": cmdJobCreate, "list": cmdJobList, "show": cmdJobShow,
		"pause":  jobSetter(jobs.RolloutPaused, "pause"),
		"resume": jobSetter(jobs.RolloutActive, "resume"),
		"cancel": jobSetter(jobs.RolloutCanceled, "cancel"),
	}, args, stdout, stderr)
}

// jobConn is the job commands' connection.
type jobConn = etcdConn[*jobs.Store]

// openJobs connects to etcd as the flags say.
func openJobs(f *twinFlags) (*jobConn, error) {
	t, err := resolveEtcd(f.config, f.etcd, f.prefix)
	if err != nil {
		return nil, err
	}
	cli, err := t.dial()
	if err != nil {
		return nil, err
	}
	return &jobConn{cli: cli, store: jobs.NewStore(cli, t.prefix), endpoints: strings.Join(t.endpoints, ",")}, nil
}

// withJobs connects, runs do with a context bounded by --timeout and
// closes the connection.
func withJobs(f *twinFlags, do func(ctx context.Context, c *jobConn) error) error {
	conn, err := openJobs(f)
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), f.timeout)
	defer cancel()
	return do(ctx, conn)
}

// noArgs parses the flags of a command that takes no arguments.
func noArgs(f *twinFlags, args []string) error {
	_, err := f.nArgs(args, 0)
	return err
}

// jobID parses the flags and the single ID argument.
func jobID(f *twinFlags, args []string) (string, error) {
	rest, err := f.nArgs(args, 1)
	if err != nil {
		return "", err
	}
	return rest[0], jobs.ValidateID(rest[0])
}

// jobView is a job with its rollout (list --json, create --json) and its
// executions (show --json).
type jobView struct {
	Job        jobs.Job         `json:"job"`
	Rollout    jobs.Rollout     `json:"rollout"`
	Executions []jobs.Execution `json:"executions,omitempty"`
}

// jobCreateFlags are create's job flags (all but --file and the etcd ones).
type jobCreateFlags struct {
	j                     jobs.Job
	image, manifest, file string
	devices, match        string
	step, reboot, total   time.Duration
}

func newJobCreateFlags(f *twinFlags) *jobCreateFlags {
	c := &jobCreateFlags{}
	fs := f.fs
	fs.StringVar(&c.j.ID, "id", "", "job id: 1 to 64 characters of [A-Za-z0-9._-]")
	fs.StringVar(&c.image, "image", "", "image `FILE`: its SHA-256 and size are computed; URL file://FILE unless --url")
	fs.StringVar(&c.j.Image.SHA256, "sha256", "", "the image's SHA-256, hex (without --image)")
	fs.Uint64Var(&c.j.Image.Size, "size", 0, "the image's size in bytes (without --image)")
	fs.StringVar(&c.j.Image.URL, "url", "", "where the gateways fetch the image: file:///… or http(s)://…")
	fs.Uint64Var(&c.j.Image.Version, "version", 0, "the image's security version (anti-rollback)")
	fs.StringVar(&c.j.Image.Name, "name", "", "the image's name, for people")
	fs.StringVar(&c.manifest, "manifest", "", "signed manifest `FILE` of the image (edgefence keys manifest)")
	fs.StringVar(&c.devices, "devices", "", "target devices, comma-separated")
	fs.StringVar(&c.match, "match", "", "target device id patterns (path.Match), comma-separated")
	fs.IntVar(&c.j.Rollout.MaxConcurrent, "max-concurrent", 0, fmt.Sprintf("executions in progress at once (default %d)", jobs.DefaultMaxConcurrent))
	fs.IntVar(&c.j.Rollout.PerMinute, "per-minute", 0, "executions started per minute (default: no bound)")
	fs.IntVar(&c.j.Rollout.Canary, "canary", 0, "canary executions first: no other starts until they succeeded; one failing aborts")
	fs.Float64Var(&c.j.Rollout.Abort.FailureRatio, "abort-ratio", 0, "abort when this share of ended executions failed (0: never)")
	fs.IntVar(&c.j.Rollout.Abort.MinExecutions, "abort-min", 0, "… once at least this many ended")
	fs.IntVar(&c.j.Chunk, "chunk", 0, fmt.Sprintf("bytes per chunk sent to the device (default %d)", jobs.DefaultChunk))
	fs.DurationVar(&c.step, "step-timeout", 0, fmt.Sprintf("bound on one step at a device (default %v)", jobs.DefaultStepTimeout))
	fs.DurationVar(&c.reboot, "reboot-timeout", 0, fmt.Sprintf("bound on the device's trial boot (default %v)", jobs.DefaultRebootTimeout))
	fs.DurationVar(&c.total, "total-timeout", 0, "bound on a device's whole execution (default: none)")
	fs.StringVar(&c.file, "file", "", "a job document `FILE` (JSON) instead of the flags above")
	return c
}

func cmdJobCreate(args []string, stdout, stderr io.Writer) error {
	f := newEtcdCmdFlags("job", "create", "", stderr)
	c := newJobCreateFlags(f)
	if err := noArgs(f, args); err != nil {
		return err
	}
	j, err := c.job(f.fs)
	if err != nil {
		return err
	}
	// Check it before connecting: a bad job never reaches etcd.
	j.ApplyDefaults()
	if err := j.Validate(); err != nil {
		return fmt.Errorf("job create: %w", err)
	}
	if j.By == "" {
		j.By = defaultWriter()
	}
	return withJobs(f, func(ctx context.Context, conn *jobConn) error {
		j, r, err := conn.store.Create(ctx, j)
		if err != nil {
			return fmt.Errorf("job create %s: %w", j.ID, conn.etcdErr(err))
		}
		if f.asJSON {
			return writeJSON(stdout, jobView{Job: j, Rollout: r})
		}
		fmt.Fprintf(stdout, "job %s created: %s, rollout %s\n", j.ID, imageText(j.Image), r.Status)
		fmt.Fprintf(stdout, "follow it: edgefence job show --watch %s\n", j.ID)
		return nil
	})
}

// job builds the job document from the flags or --file.
func (c *jobCreateFlags) job(fs *flag.FlagSet) (jobs.Job, error) {
	if c.file != "" {
		var others []string
		fs.Visit(func(fl *flag.Flag) {
			switch fl.Name {
			case "file", "json", "config", "etcd", "prefix", "timeout":
			default:
				others = append(others, "--"+fl.Name)
			}
		})
		if len(others) > 0 {
			fmt.Fprintf(fs.Output(), "job create: --file takes the whole job; drop %s\n", strings.Join(others, " "))
			return jobs.Job{}, exitError{2}
		}
		return readJobFile(c.file)
	}
	j := c.j
	j.Timeout = jobs.Timeouts{Step: jobs.Duration(c.step), Reboot: jobs.Duration(c.reboot), Total: jobs.Duration(c.total)}
	j.Targets = jobs.Targets{Devices: splitList(c.devices), Match: splitList(c.match)}
	if c.image != "" {
		if err := c.hashImage(&j.Image); err != nil {
			return jobs.Job{}, err
		}
	}
	if c.manifest != "" {
		b, err := os.ReadFile(c.manifest)
		if err != nil {
			return jobs.Job{}, fmt.Errorf("job create: --manifest: %w", err)
		}
		j.Image.Manifest = b
	}
	return j, nil
}

// hashImage fills in the image's SHA-256, size and (unless given) URL from
// the --image file; a --sha256 or --size given too must agree.
func (c *jobCreateFlags) hashImage(img *jobs.ImageRef) error {
	abs, err := filepath.Abs(c.image)
	if err != nil {
		return fmt.Errorf("job create: --image: %w", err)
	}
	fh, err := os.Open(abs)
	if err != nil {
		return fmt.Errorf("job create: --image: %w", err)
	}
	defer fh.Close()
	h := sha256.New()
	n, err := io.Copy(h, fh)
	if err != nil {
		return fmt.Errorf("job create: --image %s: %w", abs, err)
	}
	sum := hex.EncodeToString(h.Sum(nil))
	switch {
	case img.SHA256 != "" && !strings.EqualFold(img.SHA256, sum):
		return fmt.Errorf("job create: --sha256 %s does not match --image %s (%s)", img.SHA256, abs, sum)
	case img.Size != 0 && img.Size != uint64(n):
		return fmt.Errorf("job create: --size %d does not match --image %s (%d bytes)", img.Size, abs, n)
	}
	img.SHA256, img.Size = sum, uint64(n)
	if img.URL == "" {
		img.URL = "file://" + abs
	}
	if img.Name == "" {
		img.Name = filepath.Base(abs)
	}
	return nil
}

// readJobFile reads a job document; unknown fields are an error.
func readJobFile(path string) (jobs.Job, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return jobs.Job{}, fmt.Errorf("job create: --file: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var j jobs.Job
	if err := dec.Decode(&j); err != nil {
		return jobs.Job{}, fmt.Errorf("job create: --file %s: %w: %v", path, jobs.ErrInvalidJob, err)
	}
	return j, nil
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func cmdJobList(args []string, stdout, stderr io.Writer) error {
	f := newEtcdCmdFlags("job", "list", "", stderr)
	if err := noArgs(f, args); err != nil {
		return err
	}
	return withJobs(f, func(ctx context.Context, conn *jobConn) error {
		all, err := conn.store.Jobs(ctx)
		if err != nil && len(all) == 0 {
			return fmt.Errorf("job list: %w", conn.etcdErr(err))
		}
		if err != nil {
			fmt.Fprintf(stderr, "edgefence: job list: %v\n", err) // undecodable documents: named, not fatal
		}
		views := make([]jobView, 0, len(all))
		for _, j := range all {
			r, err := conn.store.Rollout(ctx, j.ID)
			if err != nil && !errors.Is(err, jobs.ErrNoJob) {
				return fmt.Errorf("job list: %w", conn.etcdErr(err))
			}
			views = append(views, jobView{Job: j, Rollout: r})
		}
		if f.asJSON {
			return writeJSON(stdout, views)
		}
		return printJobList(stdout, views)
	})
}

// jobSetter is pause, resume or cancel: the rollout to status to.
func jobSetter(to jobs.RolloutStatus, verb string) command {
	return func(args []string, stdout, stderr io.Writer) error {
		f := newEtcdCmdFlags("job", verb, " ID", stderr)
		reason := f.fs.String("reason", "", "why, recorded in the rollout")
		id, err := jobID(f, args)
		if err != nil {
			return err
		}
		return withJobs(f, func(ctx context.Context, conn *jobConn) error {
			r, err := conn.store.SetRollout(ctx, id, to, *reason)
			if err != nil {
				return fmt.Errorf("job %s %s: %w", verb, id, conn.etcdErr(err))
			}
			if f.asJSON {
				return writeJSON(stdout, r)
			}
			fmt.Fprintf(stdout, "job %s: rollout %s\n", id, r.Status)
			return nil
		})
	}
}
