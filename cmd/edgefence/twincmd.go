package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/user"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/shadow"
)

// defaultConfig is the config file the commands that need one read when
// none is named.
const defaultConfig = "/etc/edgefence/config.yaml"

// exitConflict is the exit status of `twin set --if-version N` losing to
// another writer: read again and retry.
const exitConflict = 5

const twinUsage = `usage: edgefence twin <command> [flags]

Read and write device twins in etcd directly (no agent needed): the desired
state operators and applications write, the reported state the device's lease
holder writes, and the delta between them (what the device still has to do).

commands:
  get   [etcd flags] [--json] DEVICE       desired, reported, delta, versions and who set each field
  set   [etcd flags] [--if-version N] [--writer NAME] [--json] DEVICE JSON
                                           merge the JSON object into desired ("-": read it from
                                           stdin): fields not named are kept, null deletes a field,
                                           objects merge field by field, arrays replace whole
  watch [etcd flags] [--json] DEVICE       print the twin, then every change of either side, until
                                           Ctrl-C (--json: one object per line)

etcd flags: --config FILE | --etcd URL[,URL] [--prefix P]   (and --timeout D)
With --config (default ` + defaultConfig + ` unless --etcd is given) etcd.endpoints and
etcd.prefix come from the file and DEVICE must be one of its devices; --etcd and
--prefix override them. With --etcd alone any valid device id is accepted and the
prefix is --prefix (default ` + agent.DefaultEtcdPrefix + `).

set --if-version N writes only if desired is still at version N (the desired
version twin get prints; 0: desired must not exist yet). Without it the patch
is merged into whatever desired is now.

Exit status: 0 done; 1 error (invalid JSON, not an object, too large or too
deeply nested: nothing written; unknown device; etcd unreachable); 2 usage;
5 conflict: desired moved past --if-version N (the current version is printed):
read it again with twin get and retry.
`

func cmdTwin(args []string, stdout, stderr io.Writer) error {
	return subcommand("twin", twinUsage, map[string]command{"get": cmdTwinGet, "set": cmdTwinSet, "watch": cmdTwinWatch}, args, stdout, stderr)
}

// twinFlags are the flags of the twin commands.
type twinFlags struct {
	fenceFlags // fs, config, asJSON, timeout and parse
	etcd       string
	prefix     string
}

func newTwinFlags(name, args string, stderr io.Writer) *twinFlags {
	return newEtcdCmdFlags("twin", name, args, stderr)
}

// newEtcdCmdFlags are the flags of a command of group (twin, job) that
// talks to etcd directly: the etcd flags, --json and --timeout.
func newEtcdCmdFlags(group, name, args string, stderr io.Writer) *twinFlags {
	f := &twinFlags{fenceFlags: fenceFlags{fs: flag.NewFlagSet(group+" "+name, flag.ContinueOnError)}}
	f.fs.SetOutput(stderr)
	addEtcdFlags(f.fs, &f.config, &f.etcd, &f.prefix)
	f.fs.BoolVar(&f.asJSON, "json", false, "print JSON")
	f.fs.DurationVar(&f.timeout, "timeout", 10*time.Second, "give up on etcd after this long")
	f.fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: edgefence %s %s [flags]%s\n\nSee 'edgefence %s help' for the rules and exit codes.\n\n", group, name, args, group)
		f.fs.PrintDefaults()
	}
	return f
}

// etcdConn is an open etcd client and the store S on it (twin: a
// shadow.Store; job: a jobs.Store).
type etcdConn[S any] struct {
	cli       *clientv3.Client
	store     S
	endpoints string
}

// twinConn is the twin commands' connection.
type twinConn = etcdConn[*shadow.Store]

func (c *etcdConn[S]) Close() error { return c.cli.Close() }

// etcdErr names the endpoints in an etcd failure.
func (c *etcdConn[S]) etcdErr(err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("etcd %s: no answer: %w", c.endpoints, err)
	}
	return err
}

// open checks dev and connects to etcd as the flags say. writer is
// recorded in the metadata of the fields written.
func (f *twinFlags) open(dev, writer string) (*twinConn, error) {
	t, err := resolveEtcd(f.config, f.etcd, f.prefix)
	if err != nil {
		return nil, err
	}
	if err := fence.ValidateDeviceID(dev); err != nil {
		return nil, err
	}
	if t.known != nil && !t.known[dev] {
		ids := make([]string, 0, len(t.known))
		for id := range t.known {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		return nil, fmt.Errorf("unknown device %q: not among the devices of %s (%s)", dev, t.config, strings.Join(ids, ", "))
	}
	cli, err := t.dial()
	if err != nil {
		return nil, err
	}
	cfg := shadow.StoreConfig{Prefix: t.prefix, Writer: writer}
	if t.known != nil {
		cfg.KnownDevice = func(d string) bool { return t.known[d] }
	}
	return &twinConn{cli: cli, store: shadow.NewStore(cli, cfg), endpoints: strings.Join(t.endpoints, ",")}, nil
}

// oneDevice parses the flags and the single DEVICE argument.
func (f *twinFlags) oneDevice(args []string) (string, error) {
	rest, err := f.nArgs(args, 1)
	if err != nil {
		return "", err
	}
	return rest[0], nil
}

// nArgs parses the flags and exactly n arguments (else usage, exit 2).
func (f *twinFlags) nArgs(args []string, n int) ([]string, error) {
	rest, err := f.parse(args)
	if err != nil {
		return nil, err
	}
	if len(rest) != n {
		f.fs.Usage()
		return nil, exitError{2}
	}
	return rest, nil
}

func cmdTwinGet(args []string, stdout, stderr io.Writer) error {
	f := newTwinFlags("get", " DEVICE", stderr)
	dev, err := f.oneDevice(args)
	if err != nil {
		return err
	}
	c, err := f.open(dev, "")
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), f.timeout)
	defer cancel()
	doc, err := c.store.Get(ctx, dev)
	if err != nil {
		return c.etcdErr(err)
	}
	if f.asJSON {
		return writeJSON(stdout, doc)
	}
	return printTwin(stdout, doc)
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// defaultWriter is "cli:<user>@<host>".
func defaultWriter() string {
	name := os.Getenv("USER")
	if u, err := user.Current(); err == nil && u.Username != "" {
		name = u.Username
	}
	if name == "" {
		name = strconv.Itoa(os.Getuid())
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "localhost"
	}
	return "cli:" + name + "@" + host
}

// twinConflict is what set --json prints on a conflict.
type twinConflict struct {
	Device  string `json:"device"`
	Error   string `json:"error"`
	Want    int64  `json:"if_version"`
	Current int64  `json:"current_version"`
}

func cmdTwinSet(args []string, stdout, stderr io.Writer) error {
	f := newTwinFlags("set", " DEVICE JSON", stderr)
	ifVersion := int64(-1)
	f.fs.Func("if-version", "write only if desired is still at version `N` (as twin get prints it; 0: not written yet); else exit 5", func(s string) error {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil || v < 0 {
			return errors.New("want a version number ≥ 0")
		}
		ifVersion = v
		return nil
	})
	writer := f.fs.String("writer", "", "who to record in the fields' metadata (default cli:<user>@<host>)")
	rest, err := f.nArgs(args, 2)
	if err != nil {
		return err
	}
	dev, body := rest[0], []byte(rest[1])
	if rest[1] == "-" {
		// One byte past the limit is enough to refuse it as too large.
		if body, err = io.ReadAll(io.LimitReader(os.Stdin, shadow.DefaultMaxSize+1)); err != nil {
			return fmt.Errorf("read the patch from stdin: %w", err)
		}
	}
	// Check the patch before connecting: bad input never reaches etcd.
	patch, err := shadow.DecodeJSON(body, shadow.Limits{})
	if err != nil {
		return fmt.Errorf("twin set %s: %w", dev, err)
	}
	if *writer == "" {
		*writer = defaultWriter()
	}
	c, err := f.open(dev, *writer)
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), f.timeout)
	defer cancel()
	var st shadow.State
	if ifVersion >= 0 {
		st, err = c.store.UpdateDesired(ctx, dev, patch, ifVersion)
	} else {
		st, err = c.store.UpdateDesiredAny(ctx, dev, patch)
	}
	var ce *shadow.ConflictError
	switch {
	case errors.As(err, &ce):
		msg := fmt.Sprintf("conflict: desired is at version %d, not %d: read it again (edgefence twin get %s) and retry", ce.Current, ce.Want, dev)
		if ce.Attempts > 0 {
			msg = fmt.Sprintf("conflict: other writers won %d times in a row (desired is at version %d): retry", ce.Attempts, ce.Current)
		}
		if f.asJSON {
			_ = writeJSON(stdout, twinConflict{Device: dev, Error: "conflict", Want: ce.Want, Current: ce.Current})
		}
		fmt.Fprintf(stderr, "edgefence: twin set %s: %s\n", dev, msg)
		return exitError{exitConflict}
	case err != nil:
		return fmt.Errorf("twin set %s: %w", dev, c.etcdErr(err))
	}
	if f.asJSON {
		return writeJSON(stdout, st)
	}
	fmt.Fprintf(stdout, "%s: desired now at version %d\n", dev, st.Version)
	return printSide(stdout, "desired", st, false)
}

func cmdTwinWatch(args []string, stdout, stderr io.Writer) error {
	f := newTwinFlags("watch", " DEVICE", stderr)
	dev, err := f.oneDevice(args)
	if err != nil {
		return err
	}
	c, err := f.open(dev, "")
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, stop := signalContext()
	defer stop()
	rctx, cancel := context.WithTimeout(ctx, f.timeout)
	doc, err := c.store.Get(rctx, dev)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return nil // interrupted
		}
		return c.etcdErr(err)
	}
	emit := func(ev shadow.TwinEvent) error { return printTwinEvent(stdout, ev, f.asJSON) }
	if err := emit(shadow.TwinEvent{Kind: shadow.EventSync, Doc: doc}); err != nil {
		return err
	}
	err = c.store.WatchTwin(ctx, dev, doc, emit)
	if ctx.Err() != nil {
		return nil // Ctrl-C
	}
	return err
}

// twinWatchLine is one line of twin watch --json.
type twinWatchLine struct {
	Time     time.Time `json:"time"`
	Kind     string    `json:"kind"` // sync, put or delete
	Side     string    `json:"side,omitempty"`
	Revision int64     `json:"revision"`
	// Changed maps the JSON Pointer of each leaf field the change set to
	// its new value, or to null if it deleted it.
	Changed map[string]any   `json:"changed,omitempty"`
	Twin    *shadow.Document `json:"twin"`
	Error   string           `json:"error,omitempty"`
}

func printTwinEvent(w io.Writer, ev shadow.TwinEvent, asJSON bool) error {
	now := time.Now()
	var changed map[string]any
	var cur shadow.State
	switch ev.Side {
	case shadow.SideDesired:
		cur = ev.Doc.Desired
	case shadow.SideReported:
		cur = ev.Doc.Reported
	}
	if ev.Kind != shadow.EventSync {
		changed = changedLeaves(ev.Prev.Fields, cur.Fields)
	}
	if asJSON {
		l := twinWatchLine{Time: now.UTC(), Kind: ev.Kind.String(), Side: ev.Side, Revision: ev.Doc.Revision, Changed: changed, Twin: ev.Doc}
		if ev.Err != nil {
			l.Error = ev.Err.Error()
		}
		b, err := json.Marshal(l)
		if err != nil {
			return err
		}
		_, err = w.Write(append(b, '\n'))
		return err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s %-8s ", now.Format("15:04:05.000"), sideOrSync(ev))
	switch ev.Kind {
	case shadow.EventSync:
		fmt.Fprintf(&b, "rev %d  desired v%d %s  reported v%d %s", ev.Doc.Revision, ev.Doc.Desired.Version,
			compact(ev.Doc.Desired.Fields), ev.Doc.Reported.Version, compact(ev.Doc.Reported.Fields))
	case shadow.EventDelete:
		fmt.Fprintf(&b, "rev %d  deleted", ev.Doc.Revision)
	default:
		fmt.Fprintf(&b, "v%d ", cur.Version) // the version is the revision of the put
		paths := make([]string, 0, len(changed))
		for p := range changed {
			paths = append(paths, p)
		}
		slices.Sort(paths)
		for _, p := range paths {
			if changed[p] == nil {
				fmt.Fprintf(&b, " %s deleted", p)
			} else {
				fmt.Fprintf(&b, " %s=%s", p, compact(changed[p]))
			}
		}
		if len(paths) == 0 {
			b.WriteString(" (no value changed)")
		}
		if by := writers(ev.Prev.Meta, cur.Meta); by != "" {
			b.WriteString("  by " + by)
		}
	}
	fmt.Fprintf(&b, "  delta %s", compact(ev.Doc.Delta))
	if ev.Err != nil {
		fmt.Fprintf(&b, "  (undecodable value: %v)", ev.Err)
	}
	b.WriteByte('\n')
	_, err := io.WriteString(w, b.String())
	return err
}

func sideOrSync(ev shadow.TwinEvent) string {
	if ev.Kind == shadow.EventSync {
		return "sync"
	}
	return ev.Side
}

// changedLeaves returns the leaf fields of cur that differ from prev, with
// their new values, and those of prev that are gone (nil).
func changedLeaves(prev, cur map[string]any) map[string]any {
	pl, cl := leafMap(prev), leafMap(cur)
	out := make(map[string]any)
	for p, v := range cl {
		if old, ok := pl[p]; !ok || !shadow.Equal(old, v) {
			out[p] = v
		}
	}
outer:
	for p := range pl {
		if _, ok := cl[p]; ok {
			continue
		}
		for q := range cl {
			if strings.HasPrefix(q, p+"/") {
				continue outer // replaced by an object
			}
		}
		out[p] = nil
	}
	return out
}

// writers names who wrote the metadata entries that changed, e.g.
// "gw-a token 1234".
func writers(prev, cur map[string]shadow.FieldMeta) string {
	var by []string
	for p, m := range cur {
		if old, ok := prev[p]; ok && old.At.Equal(m.At) && old.By == m.By && old.Token == m.Token {
			continue
		}
		s := orDash(m.By)
		if m.Token != 0 {
			s += " token " + strconv.FormatInt(m.Token, 10)
		}
		if !slices.Contains(by, s) {
			by = append(by, s)
		}
	}
	slices.Sort(by)
	return strings.Join(by, ", ")
}

// leaf is a field of a state that is not an object (or an empty object),
// named by its JSON Pointer.
type leaf struct {
	path  string
	value any
}

func leaves(m map[string]any) []leaf {
	var out []leaf
	var walk func(base string, m map[string]any)
	walk = func(base string, m map[string]any) {
		for k, v := range m {
			p := base + "/" + strings.NewReplacer("~", "~0", "/", "~1").Replace(k)
			if sub, ok := v.(map[string]any); ok && len(sub) > 0 {
				walk(p, sub)
				continue
			}
			out = append(out, leaf{p, v})
		}
	}
	walk("", m)
	slices.SortFunc(out, func(a, b leaf) int { return strings.Compare(a.path, b.path) })
	return out
}

func leafMap(m map[string]any) map[string]any {
	out := make(map[string]any)
	for _, l := range leaves(m) {
		out[l.path] = l.value
	}
	return out
}

// compact is v as compact JSON.
func compact(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

// printTwin writes a twin for people: each side field by field with who
// set it, then the delta.
func printTwin(w io.Writer, doc *shadow.Document) error {
	fmt.Fprintf(w, "%s  twin version %d, read at etcd revision %d\n\n", doc.Device, doc.Version, doc.Revision)
	if err := printSide(w, "desired", doc.Desired, false); err != nil {
		return err
	}
	fmt.Fprintln(w)
	if err := printSide(w, "reported", doc.Reported, true); err != nil {
		return err
	}
	fmt.Fprintln(w)
	if len(doc.Delta) == 0 {
		_, err := fmt.Fprintln(w, "delta: none (reported matches every desired field)")
		return err
	}
	fmt.Fprintln(w, "delta (desired fields the device has not reported yet):")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, l := range leaves(doc.Delta) {
		fmt.Fprintf(tw, "  %s\t%s\n", l.path, compact(l.value))
	}
	return tw.Flush()
}

// printSide writes one side's fields with their metadata.
func printSide(w io.Writer, name string, st shadow.State, tokens bool) error {
	switch {
	case st.Version == 0:
		_, err := fmt.Fprintf(w, "%s: not written (version 0)\n", name)
		return err
	case name == "desired":
		fmt.Fprintf(w, "desired: version %d (twin set --if-version %d)\n", st.Version, st.Version)
	default:
		fmt.Fprintf(w, "%s: version %d\n", name, st.Version)
	}
	ls := leaves(st.Fields)
	if len(ls) == 0 {
		_, err := fmt.Fprintln(w, "  (no fields)")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	head := "  FIELD\tVALUE\tSET AT\tBY"
	if tokens {
		head += "\tTOKEN"
	}
	fmt.Fprintln(tw, head)
	for _, l := range ls {
		at, by, tok := "-", "-", "-"
		if m, ok := st.Meta[l.path]; ok {
			at, by = m.At.UTC().Format("2006-01-02T15:04:05.000Z"), orDash(m.By)
			if m.Token != 0 {
				tok = strconv.FormatInt(m.Token, 10)
			}
		}
		line := fmt.Sprintf("  %s\t%s\t%s\t%s", l.path, compact(l.value), at, by)
		if tokens {
			line += "\t" + tok
		}
		fmt.Fprintln(tw, line)
	}
	return tw.Flush()
}
