package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.etcd.io/bbolt"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/fence"
)

// fenceTable creates a fence table in dir with three devices' marks and
// returns its path.
func fenceTable(t *testing.T, dir string) string {
	t.Helper()
	path := filepath.Join(dir, fence.TableFile)
	at := time.Date(2026, 3, 1, 12, 30, 45, 123e6, time.UTC)
	tab, err := fence.OpenTable(path, &fence.TableOptions{Now: func() time.Time { return at }})
	if err != nil {
		t.Fatal(err)
	}
	defer tab.Close()
	for _, c := range []struct {
		dev, holder string
		tok         fence.Token
		seq         uint64
	}{
		{"pump-7", "gw-a", 7, 1},
		{"pump-7", "gw-b", 9, 1},
		{"pump-7", "gw-b", 9, 2},
		{"meter-1", "gw-a", 12, 1},
		{"drive.2", "", 3, 40},
	} {
		env := &fence.Envelope{V: fence.Version, Device: c.dev, Token: c.tok, Seq: c.seq,
			ID: "c-" + c.dev, Kind: "set", Holder: c.holder}
		if v, _, err := tab.Admit(context.Background(), env); v != fence.Accepted || err != nil {
			t.Fatal(v, err)
		}
	}
	return path
}

const fenceListWant = `DEVICE   TOKEN  SEQ  HOLDER  WHEN                      COMMAND
drive.2  3      40   -       2026-03-01T12:30:45.123Z  c-drive.2
meter-1  12     1    gw-a    2026-03-01T12:30:45.123Z  c-meter-1
pump-7   9      2    gw-b    2026-03-01T12:30:45.123Z  c-pump-7
`

func TestFenceList(t *testing.T) {
	dir := t.TempDir()
	path := fenceTable(t, dir)

	r := edgefence(t, "fence", "list", "--table", path)
	if r.code != 0 || r.stderr != "" || r.stdout != fenceListWant {
		t.Fatalf("%s\nwant stdout:\n%s", r, fenceListWant)
	}

	// The table of the agent a config file describes: <state_dir>/fence.db.
	cfg := filepath.Join(dir, "agent.yaml")
	if err := os.WriteFile(cfg, []byte(goodConfig+"state_dir: "+dir+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r = edgefence(t, "fence", "list", "--config", cfg, "--json")
	if r.code != 0 || r.stderr != "" {
		t.Fatal(r)
	}
	var recs []fence.Record
	if err := json.Unmarshal([]byte(r.stdout), &recs); err != nil {
		t.Fatalf("%v\n%s", err, r)
	}
	if len(recs) != 3 || recs[2].Device != "pump-7" || recs[2].Mark != (fence.Mark{Token: 9, Seq: 2}) ||
		recs[2].Holder != "gw-b" || recs[2].ID != "c-pump-7" || recs[2].At.UnixMilli() != 1772368245123 {
		t.Errorf("JSON records %+v", recs)
	}
	if !strings.Contains(r.stdout, `"mark": {`) || !strings.Contains(r.stdout, `"token": 9`) {
		t.Errorf("JSON layout:\n%s", r.stdout)
	}

	// An empty table: the header, or an empty JSON array.
	empty := filepath.Join(t.TempDir(), fence.TableFile)
	tab, err := fence.OpenTable(empty, nil)
	if err != nil {
		t.Fatal(err)
	}
	tab.Close()
	if r := edgefence(t, "fence", "list", "--table", empty); r.code != 0 || r.stdout != "DEVICE  TOKEN  SEQ  HOLDER  WHEN  COMMAND\n" {
		t.Error(r)
	}
	if r := edgefence(t, "fence", "list", "--table", empty, "--json"); r.code != 0 || r.stdout != "[]\n" {
		t.Error(r)
	}
}

func TestFenceShow(t *testing.T) {
	path := fenceTable(t, t.TempDir())

	// Flags may follow the devices; devices print in the order asked.
	r := edgefence(t, "fence", "show", "pump-7", "meter-1", "--table", path)
	want := "DEVICE   TOKEN  SEQ  HOLDER  WHEN                      COMMAND\n" +
		"pump-7   9      2    gw-b    2026-03-01T12:30:45.123Z  c-pump-7\n" +
		"meter-1  12     1    gw-a    2026-03-01T12:30:45.123Z  c-meter-1\n"
	if r.code != 0 || r.stdout != want || r.stderr != "" {
		t.Fatalf("%s\nwant stdout:\n%s", r, want)
	}

	r = edgefence(t, "fence", "show", "--json", "--table", path, "drive.2")
	var recs []fence.Record
	if err := json.Unmarshal([]byte(r.stdout), &recs); err != nil || r.code != 0 {
		t.Fatalf("%v\n%s", err, r)
	}
	if len(recs) != 1 || recs[0].Mark != (fence.Mark{Token: 3, Seq: 40}) || recs[0].Holder != "" {
		t.Errorf("%+v", recs)
	}

	// Unknown and malformed devices: the others still print, exit 1.
	r = edgefence(t, "fence", "show", "--table", path, "pump-7", "pump-8", "bad/id")
	if r.code != 1 || !strings.Contains(r.stdout, "pump-7 ") || !strings.Contains(r.stderr, "pump-8: no mark") ||
		!strings.Contains(r.stderr, "bad/id") {
		t.Error(r)
	}
}

func TestFenceErrors(t *testing.T) {
	dir := t.TempDir()
	path := fenceTable(t, dir)
	garbage := filepath.Join(dir, "garbage.db")
	if err := os.WriteFile(garbage, []byte(strings.Repeat("not a bbolt file\n", 512)), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string // in stderr
	}{
		{"no command", []string{"fence"}, 2, "usage: edgefence fence"},
		{"unknown command", []string{"fence", "drop"}, 2, `unknown command "drop"`},
		{"help", []string{"fence", "-h"}, 0, ""},
		{"list help", []string{"fence", "list", "-h"}, 0, "-table"},
		{"bad flag", []string{"fence", "list", "--tabel", path}, 2, "-tabel"},
		{"list with arguments", []string{"fence", "list", "--table", path, "pump-7"}, 2, "usage"},
		{"show without devices", []string{"fence", "show", "--table", path}, 2, "usage"},
		{"table and config", []string{"fence", "list", "--table", path, "--config", path}, 2, "usage"},
		{"missing table", []string{"fence", "list", "--table", filepath.Join(dir, "nope.db")}, 1, "no such file"},
		{"bad config", []string{"fence", "list", "--config", filepath.Join(dir, "nope.yaml")}, 1, "nope.yaml"},
		{"not a table", []string{"fence", "list", "--table", garbage}, 1, "fence table corrupt"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := edgefence(t, tc.args...)
			if r.code != tc.code || !strings.Contains(r.stderr, tc.want) {
				t.Errorf("%s\nwant exit %d and %q in stderr", r, tc.code, tc.want)
			}
		})
	}

	// A running agent holds the table: time out with the hint, not hang.
	t.Run("held by an agent", func(t *testing.T) {
		tab, err := fence.OpenTable(path, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tab.Close()
		r := edgefence(t, "fence", "list", "--table", path, "--timeout", "200ms")
		if r.code != 1 || !strings.Contains(r.stderr, "another edgefence process holds the fence table") ||
			!strings.Contains(r.stderr, "ask the agent") || r.stdout != "" {
			t.Error(r)
		}
	})

	// A corrupt record: the readable ones print, the bad one is named, exit 1.
	t.Run("corrupt record", func(t *testing.T) {
		db, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		err = db.Update(func(tx *bbolt.Tx) error {
			return tx.Bucket([]byte("fence.marks")).Put([]byte("meter-1"), []byte("garbage"))
		})
		db.Close()
		if err != nil {
			t.Fatal(err)
		}
		r := edgefence(t, "fence", "list", "--table", path)
		if r.code != 1 || !strings.Contains(r.stdout, "pump-7 ") || strings.Contains(r.stdout, "meter-1") ||
			!strings.Contains(r.stderr, "meter-1") || !strings.Contains(r.stderr, "corrupt") {
			t.Error(r)
		}
		r = edgefence(t, "fence", "show", "--table", path, "meter-1")
		if r.code != 1 || !strings.Contains(r.stderr, "corrupt") {
			t.Error(r)
		}
	})
}

// On a gateway that is home of no `fence: gateway` device there is no
// fence table: list and show say so, with --config (no file) and with
// --socket (the agent answers 404), exit 1, and print no table header.
func TestFenceNoTable(t *testing.T) {
	dir := t.TempDir()
	w := newAPIWorld(t, dir)
	cfg, sock := w.serve("nohome", "  - id: dev-1\n    auth: off\n  - id: plc-2\n    fence: gateway\n    home: gw-2\n    auth: off\n", agent.Options{})
	for _, args := range [][]string{
		{"fence", "list", "--config", cfg},
		{"fence", "list", "--config", cfg, "--json"},
		{"fence", "show", "--config", cfg, "plc-2"},
		{"fence", "list", "--socket", sock},
		{"fence", "list", "--socket", sock, "--json"},
		{"fence", "show", "--socket", sock, "plc-2"},
	} {
		r := edgefence(t, args...)
		// The temp dir's random name may itself hold "404" (CI once
		// ran in /tmp/api-1990334045): look for it outside the paths.
		why := strings.ReplaceAll(strings.ReplaceAll(r.stderr, sock, ""), cfg, "")
		if r.code != 1 || r.stdout != "" || !strings.Contains(r.stderr, "is home of no `fence: gateway` device, so it keeps none") ||
			strings.Contains(why, "no such file") || strings.Contains(why, "404") {
			t.Errorf("%q: want exit 1, nothing on stdout, and why there is no table\n%s", args, r)
		}
		if strings.Contains(strings.Join(args, " "), "--socket") && !strings.Contains(r.stderr, sock) {
			t.Errorf("%q: the agent is not named\n%s", args, r)
		}
		if strings.Contains(strings.Join(args, " "), "--config") && !strings.Contains(r.stderr, "gateway gw-1 is home") {
			t.Errorf("%q: the gateway is not named\n%s", args, r)
		}
	}

	// The home of a device whose agent never ran: no file yet, and why.
	home, _ := w.serve("home", "  - id: plc-1\n    fence: gateway\n    home: gw-1\n    mqtt_topic: site/plc-1\n    auth: off\n", agent.Options{})
	if err := os.Remove(filepath.Join(dir, fence.TableFile)); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	r := edgefence(t, "fence", "list", "--config", home)
	if r.code != 1 || r.stdout != "" || !strings.Contains(r.stderr, "its agent creates the table when it first starts") {
		t.Errorf("home without a table yet\n%s", r)
	}
}
