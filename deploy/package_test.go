package deploy_test

import (
	"archive/tar"
	"bufio"
	"bytes"
	"errors"
	"io"
	"maps"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgefence/edgefence/agent"
)

// `make package ARCHS=amd64` builds the edgefence and edgefence-devsim
// packages from deploy/nfpm*.yaml; this checks what dpkg would install:
// files, modes and owners, control fields, the conffile, maintainer scripts
// that enable and start nothing, a binary that runs, a default config that
// is refused until `edgefence keys init` has given it a key (secure by
// default) and then validates and matches the unit's directories and
// credentials, and a unit that systemd-analyze accepts with the binary
// where ExecStart says it is.
func TestPackage(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds the packages (go build, nfpm via go run)")
	}
	mk := tool(t, "make", "apt-get install make")
	dpkgDeb := tool(t, "dpkg-deb", "apt-get install dpkg")

	dist := amd64Packages(t, mk)
	deb := filepath.Join(dist, "edgefence_"+version+"_amd64.deb")
	t.Run("control", func(t *testing.T) {
		f := control(t, dpkgDeb, deb)
		for k, want := range map[string]string{"Package": "edgefence", "Version": version, "Architecture": "amd64",
			"Homepage": "https://github.com/edgefence/edgefence"} {
			if f[k] != want {
				t.Errorf("%s: %q, want %q", k, f[k], want)
			}
		}
		// A static Go binary (CGO off): nothing to depend on.
		if d, ok := f["Depends"]; ok {
			t.Errorf("Depends: %q, want none", d)
		}
		if !regexp.MustCompile(`^[^<>]+ <[^<>@ ]+@[^<>@ ]+>$`).MatchString(f["Maintainer"]) {
			t.Errorf("Maintainer: %q, want Name <address>", f["Maintainer"])
		}
		if !strings.Contains(f["Description"], "enables and starts nothing") {
			t.Errorf("Description does not say the package starts nothing:\n%s", f["Description"])
		}
	})

	t.Run("files", func(t *testing.T) {
		checkFiles(t, dpkgDeb, deb, map[string]os.FileMode{
			"/usr/bin/edgefence":                 0o755,
			unitPath:                             0o644,
			"/etc/edgefence/config.yaml":         0o644, // read by a DynamicUser: not 0640 root
			profileEM:                            0o644,
			profileTC:                            0o644,
			"/usr/share/doc/edgefence/README.md": 0o644,
			"/usr/share/doc/edgefence/copyright": 0o644,
		})
	})

	ctrl := t.TempDir()
	run(t, time.Minute, ".", nil, dpkgDeb, "-e", deb, ctrl)
	t.Run("conffiles", func(t *testing.T) {
		b, err := os.ReadFile(filepath.Join(ctrl, "conffiles"))
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Fields(string(b)); !slices.Equal(got, []string{"/etc/edgefence/config.yaml", profileEM, profileTC}) {
			t.Fatalf("conffiles %q, want exactly /etc/edgefence/config.yaml and the two profiles", got)
		}
	})
	t.Run("maintainer scripts", func(t *testing.T) {
		checkScripts(t, ctrl)
	})

	root := t.TempDir()
	run(t, time.Minute, ".", nil, dpkgDeb, "-x", deb, root)
	t.Run("same files as the tree", func(t *testing.T) {
		for inst, src := range map[string]string{unitPath: "deploy/edgefence.service",
			"/etc/edgefence/config.yaml": "configs/edgefence.example.yaml", "/usr/share/doc/edgefence/copyright": "deploy/copyright",
			profileEM: "configs/profiles/energy-meter.yaml", profileTC: "configs/profiles/hvac-controller.yaml"} {
			a, err1 := os.ReadFile(filepath.Join(root, inst))
			b, err2 := os.ReadFile(filepath.Join(repoRoot, src))
			if err := errors.Join(err1, err2); err != nil || !bytes.Equal(a, b) {
				t.Errorf("%s differs from %s (%v)", inst, src, err)
			}
		}
	})
	t.Run("config matches the unit", func(t *testing.T) {
		checkConfigMatchesUnit(t, root)
	})
	t.Run("binary runs", func(t *testing.T) {
		if runtime.GOOS+"/"+runtime.GOARCH != "linux/amd64" {
			skipUnlessCI(t, "an amd64 binary on %s/%s", runtime.GOOS, runtime.GOARCH)
		}
		bin := filepath.Join(root, "usr/bin/edgefence")
		out := string(run(t, time.Minute, ".", nil, bin, "version"))
		if !strings.Contains(out, "edgefence "+describe+" ") || !strings.Contains(out, "linux/amd64") {
			t.Errorf("installed edgefence version: %q, want %q and linux/amd64", out, describe)
		}
		// The installed default config is refused as shipped: its devices
		// are signed and it has no key yet. The error names the command
		// that fixes it, and once that has run it is valid.
		cfg := filepath.Join(root, "etc/edgefence/config.yaml")
		msg, err := runErr(t, time.Minute, ".", nil, bin, append(checkConfig, cfg)...)
		if err == nil || !strings.Contains(string(msg), "run `edgefence keys init --config "+cfg+"`") {
			t.Errorf("config check of the default config as shipped: %v, want a refusal naming keys init\n%s", err, msg)
		}
		run(t, time.Minute, ".", nil, bin, "keys", "init", "--config", cfg, "--dir", filepath.Join(root, "etc/edgefence/keys"))
		run(t, time.Minute, ".", nil, bin, append(checkConfig, cfg)...)
	})
	t.Run("systemd-analyze verify", func(t *testing.T) {
		verifyUnit(t, root)
	})

	t.Run("devsim package", func(t *testing.T) {
		devsim := filepath.Join(dist, "edgefence-devsim_"+version+"_amd64.deb")
		f := control(t, dpkgDeb, devsim)
		if f["Package"] != "edgefence-devsim" || f["Version"] != version || f["Architecture"] != "amd64" {
			t.Errorf("control: %q", f)
		}
		checkFiles(t, dpkgDeb, devsim, map[string]os.FileMode{
			"/usr/bin/edgefence-devsim":                 0o755,
			"/usr/share/doc/edgefence-devsim/copyright": 0o644,
		})
		c := t.TempDir()
		run(t, time.Minute, ".", nil, dpkgDeb, "-e", devsim, c)
		if ents, _ := os.ReadDir(c); len(ents) != 2 { // control, md5sums
			t.Errorf("devsim control archive has %d files, want control and md5sums only (no conffiles, no scripts)", len(ents))
		}
		r := t.TempDir()
		run(t, time.Minute, ".", nil, dpkgDeb, "-x", devsim, r)
		a, err1 := os.ReadFile(filepath.Join(r, "usr/share/doc/edgefence-devsim/copyright"))
		b, err2 := os.ReadFile("copyright")
		if err := errors.Join(err1, err2); err != nil || !bytes.Equal(a, b) {
			t.Errorf("devsim's copyright differs from deploy/copyright (%v)", err)
		}
	})
}

// unitPath is where the package installs the unit: systemd's directory for
// units of installed packages, /usr/lib/systemd/system (not /lib, which
// merged-/usr systems only alias).
const unitPath = "/usr/lib/systemd/system/edgefence.service"

// The example Modbus device profiles the default config names.
const (
	profileEM = "/etc/edgefence/profiles/energy-meter.yaml"
	profileTC = "/etc/edgefence/profiles/hvac-controller.yaml"
)

// A describe string with commits after a tag and a dirty tree: the Debian
// version must come out valid and sort after 1.2.3.
const describe, version = "v1.2.3-4-gabc1234-dirty", "1.2.3+git4.gabc1234.dirty"

var packages struct {
	sync.Mutex
	dist string
}

// amd64Packages runs `make package ARCHS=amd64` once per test binary and
// returns the directory with the .debs (TestPackage and
// TestInstallAndOperate share it).
func amd64Packages(t *testing.T, mk string) string {
	t.Helper()
	packages.Lock()
	defer packages.Unlock()
	if packages.dist == "" {
		dist, err := os.MkdirTemp("", "edgefence-deb-")
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if out, err := runErr(t, 10*time.Minute, repoRoot, nil, mk, "-s", "package", "ARCHS=amd64", "DIST="+dist, "VERSION="+describe); err != nil {
			os.RemoveAll(dist)
			t.Fatalf("make package ARCHS=amd64: %v\n%s", err, out)
		}
		t.Logf("make package ARCHS=amd64: %.1f s", time.Since(start).Seconds())
		packages.dist = dist
	}
	return packages.dist
}

// control returns the package's control fields.
func control(t *testing.T, dpkgDeb, deb string) map[string]string {
	t.Helper()
	out := run(t, time.Minute, ".", nil, dpkgDeb, "-f", deb)
	f := map[string]string{}
	var last string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, " ") && last != "" {
			f[last] += "\n" + l
			continue
		}
		k, v, ok := strings.Cut(l, ":")
		if !ok {
			t.Fatalf("control line %q", l)
		}
		last, f[k] = k, strings.TrimSpace(v)
	}
	return f
}

// checkFiles checks the package's data archive: exactly the regular files
// in want, with those modes, everything owned by root, directories 0755 and
// nothing under /var (systemd makes the state directory; see nfpm.yaml).
func checkFiles(t *testing.T, dpkgDeb, deb string, want map[string]os.FileMode) {
	t.Helper()
	out := run(t, time.Minute, ".", nil, dpkgDeb, "--fsys-tarfile", deb)
	tr := tar.NewReader(bytes.NewReader(out))
	seen := map[string]bool{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		name := path.Clean("/" + h.Name)
		if h.Uid != 0 || h.Gid != 0 {
			t.Errorf("%s owned by %d:%d, want root", name, h.Uid, h.Gid)
		}
		if name == "/var" || strings.HasPrefix(name, "/var/") {
			t.Errorf("%s: the package must not create anything under /var", name)
		}
		mode := os.FileMode(h.Mode & 0o7777) // with setuid, setgid, sticky (0o7000): none wanted
		switch h.Typeflag {
		case tar.TypeDir:
			if mode != 0o755 {
				t.Errorf("directory %s: mode %o, want 755", name, mode)
			}
		case tar.TypeReg:
			seen[name] = true
			w, ok := want[name]
			if !ok {
				t.Errorf("unexpected file %s", name)
			} else if mode != w {
				t.Errorf("%s: mode %o, want %o", name, mode, w)
			}
		default:
			t.Errorf("%s: unexpected tar entry type %q", name, h.Typeflag)
		}
	}
	for name := range want {
		if !seen[name] {
			t.Errorf("%s is not in the package", name)
		}
	}
}

// unitChanges are the systemctl verbs that would enable or start the
// agent; no maintainer script may use them.
var unitChanges = []string{"enable", "start", "restart", "try-restart", "reload-or-restart",
	"try-reload-or-restart", "condrestart", "--now", "unmask", "reenable", "isolate"}

func checkScripts(t *testing.T, ctrl string) {
	for _, s := range []struct{ name, src string }{{"postinst", "postinst.sh"}, {"prerm", "prerm.sh"}, {"postrm", "postrm.sh"}} {
		p := filepath.Join(ctrl, s.name)
		b, err := os.ReadFile(p)
		if err != nil {
			t.Errorf("%s: %v", s.name, err)
			continue
		}
		if src, err := os.ReadFile(s.src); err != nil || !bytes.Equal(b, src) {
			t.Errorf("%s differs from deploy/%s (%v)", s.name, s.src, err)
		}
		if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o755 {
			t.Errorf("%s: %v, want mode 755", s.name, fi.Mode())
		}
		if !bytes.HasPrefix(b, []byte("#!/bin/sh\n")) {
			t.Errorf("%s does not start with #!/bin/sh", s.name)
		}
		if out, err := runErr(t, time.Minute, ".", nil, "sh", "-n", p); err != nil {
			t.Errorf("sh -n %s: %v %s", s.name, err, out)
		}
		for i, l := range strings.Split(string(b), "\n") {
			code, _, _ := strings.Cut(l, "#") // comments may say what the script does not do
			for _, w := range strings.FieldsFunc(code, func(r rune) bool { return r != '-' && (r < 'a' || r > 'z') }) {
				if slices.Contains(unitChanges, w) {
					t.Errorf("%s:%d runs %q: %s", s.name, i+1, w, strings.TrimSpace(l))
				}
			}
		}
	}
	post, _ := os.ReadFile(filepath.Join(ctrl, "postinst"))
	if !bytes.Contains(post, []byte("[ -d /run/systemd/system ]")) || !bytes.Contains(post, []byte("systemctl daemon-reload")) {
		t.Errorf("postinst: want a daemon-reload guarded by [ -d /run/systemd/system ]:\n%s", post)
	}
	pre, _ := os.ReadFile(filepath.Join(ctrl, "prerm"))
	if !bytes.Contains(pre, []byte(`"$1" = remove`)) || !bytes.Contains(pre, []byte("deb-systemd-invoke stop edgefence.service")) {
		t.Errorf("prerm: want deb-systemd-invoke stop on remove:\n%s", pre)
	}
}

// checkConfigMatchesUnit: the unit reads the installed config, and the
// config's state_dir and socket are in the directories systemd makes for
// the unit (StateDirectory, RuntimeDirectory).
func checkConfigMatchesUnit(t *testing.T, root string) {
	unit, err := os.ReadFile(filepath.Join(root, unitPath))
	if err != nil {
		t.Fatal(err)
	}
	key := func(k string) string {
		m := regexp.MustCompile(`(?m)^` + k + `=(.*)$`).FindSubmatch(unit)
		if m == nil {
			t.Fatalf("the unit has no %s=", k)
		}
		return string(m[1])
	}
	if want := "/usr/bin/edgefence run --config /etc/edgefence/config.yaml"; key("ExecStart") != want {
		t.Errorf("ExecStart=%s, want %s (the binary and conffile the package installs)", key("ExecStart"), want)
	}
	// The files `keys init` writes reach the agent's DynamicUser as the
	// credentials named after the config keys that name them, each with a
	// blank fallback (a missing file must not stop the unit before the
	// agent can say what to run).
	creds := map[string]string{}
	for _, m := range regexp.MustCompile(`(?m)^(Load|Set)Credential=([^:\n]+):(.*)$`).FindAllStringSubmatch(string(unit), -1) {
		creds[m[1]+" "+m[2]] = m[3]
	}
	a := agent.AuthConfig{KeyFile: "/etc/edgefence/keys/gateway.key", KeyID: "gw-01/1", Certificate: "/etc/edgefence/keys/gateway.cert",
		TrustRoot: "/etc/edgefence/keys/root.pub", TrustRootKID: "operator"}
	want := map[string]string{"Load auth.key_file": a.KeyFile, "Load auth.certificate": a.Certificate, "Load auth.trust_root": a.TrustRoot,
		"Set auth.key_file": `\n`, "Set auth.certificate": `\n`, "Set auth.trust_root": `\n`}
	if !maps.Equal(creds, want) {
		t.Errorf("the unit's credentials %q, want %q", creds, want)
	}
	b, err := os.ReadFile(filepath.Join(root, "etc/edgefence/config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	keyed, err := agent.WithAuth(b, a) // as `keys init` leaves it
	if err != nil {
		t.Fatal(err)
	}
	c, err := agent.ParseConfig(keyed)
	if err != nil {
		t.Fatal(err)
	}
	if want := "/var/lib/" + key("StateDirectory"); c.StateDir != want {
		t.Errorf("state_dir %s, want %s (StateDirectory=)", c.StateDir, want)
	}
	if want := "/run/" + key("RuntimeDirectory"); filepath.Dir(c.API.Socket) != want {
		t.Errorf("api.socket %s, want it in %s (RuntimeDirectory=)", c.API.Socket, want)
	}
}

// verifyUnit runs systemd-analyze verify on the installed unit inside the
// scratch root (--root), so ExecStart's /usr/bin/edgefence is the installed
// binary. The root needs the targets the unit orders itself against: they
// are copied from the host.
func verifyUnit(t *testing.T, root string) {
	sa := tool(t, "systemd-analyze", "apt-get install systemd")
	var host string
	for _, d := range []string{"/usr/lib/systemd/system", "/lib/systemd/system"} {
		if fs, _ := filepath.Glob(d + "/*.target"); len(fs) > 0 {
			host = d
			break
		}
	}
	if host == "" {
		skipUnlessCI(t, "no systemd targets on this host to verify the unit against")
	}
	targets, _ := filepath.Glob(host + "/*.target")
	sl, _ := filepath.Glob(host + "/*.slice")
	for _, u := range append(targets, sl...) {
		b, err := os.ReadFile(u) // follows the alias symlinks
		if err != nil {
			continue
		}
		if err := os.WriteFile(filepath.Join(root, filepath.Dir(unitPath), filepath.Base(u)), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out, err := runErr(t, time.Minute, ".", nil, sa, "verify", "--root="+root, "edgefence.service")
	if err != nil || len(bytes.TrimSpace(out)) != 0 {
		t.Fatalf("systemd-analyze verify --root: %v; want exit 0 and no warnings:\n%s", err, out)
	}
	// It does look at the root: without the binary it fails.
	bin := filepath.Join(root, "usr/bin/edgefence")
	if err := os.Rename(bin, bin+".away"); err != nil {
		t.Fatal(err)
	}
	defer os.Rename(bin+".away", bin)
	if out, err := runErr(t, time.Minute, ".", nil, sa, "verify", "--root="+root, "edgefence.service"); err == nil {
		t.Errorf("systemd-analyze verify passed without %s: it is not checking the scratch root\n%s", bin, out)
	}
}
