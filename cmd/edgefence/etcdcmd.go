package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/fence"
)

const etcdUsage = `usage: edgefence etcd <command> [flags]

Maintenance of the etcd the agents take their leases from.

commands:
  bump-revision [etcd flags] --to N | --from FILE... [--writers N] [--dry-run | --estimate D] [--compact] [--json]
        raise etcd's revision to at least N with single writes, so that every
        token etcd grants afterwards is above N: the recovery from a token
        regression on any etcd version (README: "Token regression")

etcd flags: --config FILE | --etcd URL[,URL] [--prefix P], as for twin.
`

func cmdEtcd(args []string, stdout, stderr io.Writer) error {
	return subcommand("etcd", etcdUsage, map[string]command{"bump-revision": cmdBumpRevision}, args, stdout, stderr)
}

// bumpReport is what bump-revision --json prints.
type bumpReport struct {
	Endpoints  []string      `json:"endpoints"`
	From       int64         `json:"from"`                    // etcd's revision before
	To         int64         `json:"to"`                      // the target
	Highest    *highestToken `json:"highest_token,omitempty"` // from --from
	Writers    int           `json:"writers"`
	DryRun     bool          `json:"dry_run,omitempty"`
	Writes     int64         `json:"writes"`
	Revision   int64         `json:"revision"`        // the highest revision a write returned
	Final      int64         `json:"final,omitempty"` // after deleting the scratch key
	Compacted  int64         `json:"compacted,omitempty"`
	Seconds    float64       `json:"seconds"`
	Rate       float64       `json:"writes_per_s"`
	Done       bool          `json:"done"`            // the revision reached the target
	ETASeconds float64       `json:"eta_s,omitempty"` // --estimate: the rest at the measured rate
	Error      string        `json:"error,omitempty"` // why it stopped short
}

// highestToken is the highest token found in --from files, and where.
type highestToken struct {
	Token  fence.Token `json:"token"`
	Device string      `json:"device"`
	File   string      `json:"file"`
	Field  string      `json:"field"` // max_token_held, token, last_ack.max_token or mark.token
}

// bumpOpts are the flags of `edgefence etcd bump-revision`.
type bumpOpts struct {
	config, etcd, prefix string
	to                   int64
	from                 []string
	writers              int
	dryRun, compact      bool
	asJSON               bool
	estimate             time.Duration
}

// parseBumpFlags reads the command's flags; a usage problem is exitUsage.
func parseBumpFlags(args []string, stderr io.Writer) (*bumpOpts, error) {
	o := &bumpOpts{}
	fs := flag.NewFlagSet("etcd bump-revision", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addEtcdFlags(fs, &o.config, &o.etcd, &o.prefix)
	fs.Func("to", "target revision `N`: afterwards etcd's revision is at least N, and every token it grants is above N", func(s string) error {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil || v <= 0 {
			return errors.New("want a revision > 0")
		}
		o.to = v
		return nil
	})
	fs.Func("from", "`FILE`: the output of `edgefence status --json` or `edgefence fence list --json` of a gateway (several concatenated are fine; - for stdin); the target is at least the highest token in it; repeatable", func(s string) error {
		o.from = append(o.from, s)
		return nil
	})
	fs.IntVar(&o.writers, "writers", agent.DefaultBumpWriters, "writes in flight at once")
	fs.BoolVar(&o.dryRun, "dry-run", false, "print the revision, the target and the writes needed; write nothing")
	fs.DurationVar(&o.estimate, "estimate", 0, "write for this long to measure the rate, then print how long the rest would take and stop (the writes done count towards the target)")
	fs.BoolVar(&o.compact, "compact", false, "compact etcd's history to the final revision (and every 10⁶ revisions on the way): frees the scratch key's versions; keeps the latest version of every live key")
	fs.BoolVar(&o.asJSON, "json", false, "print the result as JSON")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), `usage: edgefence etcd bump-revision [flags] --to N | --from FILE... (or both: the higher)

Raise etcd's revision to at least N by writing a scratch key,
<prefix>`+agent.BumpScratchKey+`, many single writes at once (each write is one
revision; a transaction of many writes is one too), then delete it. Every
token etcd grants afterwards is above N: after a token regression, N is the
highest token the devices hold (max_token_held and last_ack.max_token in
`+"`edgefence status --json`"+` of every gateway, the marks in `+"`edgefence fence list`"+`).
Works on any etcd version; with etcd >= 3.5.10, `+"`etcdutl snapshot restore\n--bump-revision`"+` does it at restore time instead. Writes only raise the revision,
which is always safe: the agents may run, and Ctrl-C stops it cleanly (run it
again to go on). Progress goes to stderr once a second.

Exit status: 0 done (or --dry-run, --estimate); 1 error or interrupted; 2 usage.`)
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args, 0); err != nil {
		return nil, err
	}
	if (o.to == 0 && len(o.from) == 0) || o.writers <= 0 || o.estimate < 0 || (o.dryRun && o.estimate > 0) {
		fs.Usage()
		return nil, exitError{exitUsage}
	}
	return o, nil
}

func cmdBumpRevision(args []string, stdout, stderr io.Writer) error {
	o, err := parseBumpFlags(args, stderr)
	if err != nil {
		return err
	}
	rep := bumpReport{To: o.to, Writers: o.writers, DryRun: o.dryRun}
	if len(o.from) > 0 {
		h, err := highestInFiles(o.from)
		if err != nil {
			return err
		}
		rep.Highest = h
		rep.To = max(rep.To, int64(h.Token))
	}
	t, err := resolveEtcd(o.config, o.etcd, o.prefix)
	if err != nil {
		return err
	}
	rep.Endpoints = t.endpoints
	cli, err := t.dial()
	if err != nil {
		return err
	}
	defer cli.Close()
	rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	cur, err := cli.Get(rctx, t.prefix+agent.BumpScratchKey, clientv3.WithCountOnly())
	cancel()
	if err != nil {
		return fmt.Errorf("etcd %v: read the revision: %w", t.endpoints, err)
	}
	rep.From, rep.Revision = cur.Header.Revision, cur.Header.Revision
	if !o.asJSON {
		fmt.Fprintf(stdout, "etcd %v: revision %d; target %d%s: %d writes, %d writers\n",
			t.endpoints, rep.From, rep.To, rep.Highest.describe(), max(0, rep.To-rep.From), rep.Writers)
	}
	if o.dryRun || rep.From >= rep.To {
		rep.Done = rep.From >= rep.To
		if o.asJSON {
			return printJSON(stdout, rep)
		}
		if rep.Done {
			fmt.Fprintf(stdout, "nothing to do: every token etcd grants is already above %d\n", rep.To)
		} else {
			fmt.Fprintln(stdout, "dry run: nothing written (--estimate 3s measures the write rate)")
		}
		return nil
	}
	ctx, stop := signalContext()
	defer stop()
	res, err := agent.BumpRevision(ctx, cli, agent.BumpConfig{
		Prefix: t.prefix, To: rep.To, Writers: o.writers, For: o.estimate, Compact: o.compact,
		Progress: func(p agent.BumpProgress) {
			fmt.Fprintf(stderr, "revision %d of %d (%.0f%%), %d writes, %.0f writes/s, %s left\n",
				p.Revision, p.To, 100*float64(p.Revision-p.From)/float64(max(1, p.To-p.From)), p.Writes, p.Rate(), p.ETA().Round(time.Second))
		},
	})
	rep.Writes, rep.Revision, rep.Final, rep.Compacted, rep.Done = res.Writes, res.Revision, res.Final, res.Compacted, res.Done
	rep.Seconds, rep.Rate = res.Elapsed.Seconds(), res.Rate()
	if o.estimate > 0 && !res.Done {
		rep.ETASeconds = res.ETA().Seconds()
	}
	if err != nil {
		rep.Error = err.Error()
	}
	if o.asJSON {
		if perr := printJSON(stdout, rep); perr != nil {
			return perr
		}
	} else {
		printBump(stdout, rep, t.prefix, o.estimate > 0)
	}
	return err
}

// printBump prints the outcome of a bump for people.
func printBump(w io.Writer, r bumpReport, prefix string, estimate bool) {
	fmt.Fprintf(w, "%d writes in %.2f s: %.0f writes/s with %d writers; revision %d\n", r.Writes, r.Seconds, r.Rate, r.Writers, r.Revision)
	if r.Final != 0 {
		fmt.Fprintf(w, "scratch key %s deleted at revision %d", prefix+agent.BumpScratchKey, r.Final)
		if r.Compacted != 0 {
			fmt.Fprintf(w, "; compacted to %d", r.Compacted)
		}
		fmt.Fprintln(w)
	}
	switch {
	case r.Done:
		fmt.Fprintf(w, "done: every token etcd grants from now on is above %d; restart the agents that refused a device (systemctl restart edgefence)\n", r.To)
	case estimate:
		fmt.Fprintf(w, "estimate: %d writes left, about %s at this rate (run again without --estimate)\n",
			r.To-r.Revision, (time.Duration(r.ETASeconds * float64(time.Second))).Round(time.Second))
	default:
		fmt.Fprintf(w, "stopped at revision %d of %d: run again to go on\n", r.Revision, r.To)
	}
}

func (h *highestToken) describe() string {
	if h == nil {
		return ""
	}
	return fmt.Sprintf(" (highest token in use %d: %s %s in %s)", h.Token, h.Device, h.Field, h.File)
}

// highestInFiles returns the highest token in the status and fence list
// outputs in files ("-" is stdin).
func highestInFiles(files []string) (*highestToken, error) {
	best := &highestToken{}
	found := false
	for _, name := range files {
		var data []byte
		var err error
		if name == "-" {
			data, err = io.ReadAll(os.Stdin)
		} else {
			data, err = os.ReadFile(name)
		}
		if err != nil {
			return nil, fmt.Errorf("--from: %w", err)
		}
		n, err := highestIn(data, name, best)
		if err != nil {
			return nil, fmt.Errorf("--from %s: %w", name, err)
		}
		found = found || n > 0
	}
	if !found {
		return nil, fmt.Errorf("--from %v: no device with a token: want the output of `edgefence status --json` or `edgefence fence list --json`", files)
	}
	return best, nil
}

// highestIn raises best to the highest token in data, a stream of JSON
// values: status objects ({"devices": [...]}) and fence record arrays. It
// returns how many tokens it saw.
func highestIn(data []byte, file string, best *highestToken) (int, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	seen := 0
	see := func(t fence.Token, dev, field string) {
		if t == 0 {
			return
		}
		seen++
		if t > best.Token {
			*best = highestToken{Token: t, Device: dev, File: file, Field: field}
		}
	}
	for {
		var raw json.RawMessage
		err := dec.Decode(&raw)
		if errors.Is(err, io.EOF) {
			return seen, nil
		}
		if err != nil {
			return seen, err
		}
		switch t := bytes.TrimSpace(raw); {
		case len(t) > 0 && t[0] == '{':
			var st agent.Status
			if err := json.Unmarshal(t, &st); err != nil {
				return seen, fmt.Errorf("not a status: %w", err)
			}
			for _, d := range st.Devices {
				see(d.MaxToken, d.ID, "max_token_held")
				see(d.Token, d.ID, "token")
				if d.LastAck != nil {
					see(d.LastAck.MaxToken, d.ID, "last_ack.max_token")
				}
			}
		case len(t) > 0 && t[0] == '[':
			var recs []fence.Record
			if err := json.Unmarshal(t, &recs); err != nil {
				return seen, fmt.Errorf("not a fence list: %w", err)
			}
			for _, r := range recs {
				see(r.Mark.Token, r.Device, "mark.token")
			}
		default:
			return seen, errors.New("want the JSON of `edgefence status --json` or `edgefence fence list --json`")
		}
	}
}
