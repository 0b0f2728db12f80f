//go:build linux

package sandbox

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/edgefence/edgefence/internal/procstat"
)

// The network lab's fixed choices. Every address lives only inside the
// lab's own namespaces; the root namespace is never touched.
const (
	netLabPrefix = "ef-"                   // every lab namespace's name starts with it
	netnsRunDir  = "/run/netns"            // where `ip netns add` mounts namespaces
	netLabOwners = "/run/edgefence-netlab" // owner records for SweepNetLabs
	netLabIPBin  = "/usr/sbin/ip"
	netLabMaxN   = 250
)

// bogusMAC is the neighbour entry a partition installs: frames still leave
// the veth, but the peer's stack drops them (not its address), so both
// sides see silence — no RST, no ICMP, no local error — as with a cut link.
const bogusMAC = "02:ef:ff:ff:ff:ff"

var nodeNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,15}$`)

// NetLab is a set of Linux network namespaces ("nodes") joined by a full
// mesh of veth pairs, for partition tests on real processes and sockets.
//
// Node i has the address 10.213.0.(i+1)/32 on its own loopback device and a
// host route to every other node over their direct veth link, with static
// neighbour entries (no ARP). Partition(a, b) makes the a–b link drop every
// frame silently in both directions (TCP connects time out, established
// connections stall, nothing is reset); Heal restores it. There is no
// forwarding between nodes, so a partitioned pair cannot reach each other
// through a third node.
//
// Each node also has its own loopback 127.0.0.1 (brought up), so servers
// with loopback-only side ports (etcd's peer URL) run unchanged inside.
//
// Processes run in a node through Command; in-process sockets through
// Listen, DialContext or Do. Close deletes the namespaces; processes still
// running in one keep it alive until they exit, so stop them first.
//
// It needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) and the ip binary.
type NetLab struct {
	id    string // short random, part of every namespace name
	nodes []string
	index map[string]int

	mu     sync.Mutex
	cut    map[[2]int]bool
	closed bool
}

// NewNetLab creates a lab with the given nodes for a test and deletes it at
// the test's cleanup. It skips the test when namespaces cannot be created
// here (not root, no ip binary), unless CI=true, where it fails instead.
func NewNetLab(t testing.TB, nodes ...string) *NetLab {
	t.Helper()
	unavailable := func(err error) {
		t.Helper()
		if os.Getenv("CI") == "true" {
			t.Fatalf("network namespaces required under CI=true: %v", err)
		}
		t.Skipf("network namespaces unavailable here (needs root and %s): %v", netLabIPBin, err)
	}
	if err := NetLabSupported(); err != nil {
		unavailable(err)
	}
	l, err := StartNetLab(nodes...)
	if err != nil {
		// Root without CAP_SYS_ADMIN (a rootless container) cannot either.
		if msg := err.Error(); strings.Contains(msg, "Operation not permitted") || strings.Contains(msg, "Permission denied") {
			unavailable(err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Errorf("netlab close: %v", err)
		}
	})
	return l
}

// NetLabSupported reports why a NetLab cannot be created here, or nil.
func NetLabSupported() error {
	if os.Geteuid() != 0 {
		return errors.New("not root")
	}
	if _, err := os.Stat(netLabIPBin); err != nil {
		return fmt.Errorf("no %s: %w", netLabIPBin, err)
	}
	return nil
}

// StartNetLab creates one namespace per node (names: lower-case letters,
// digits and '-', at most 16 characters; at least two nodes) and links every
// pair. On error nothing is left behind. Close deletes the lab.
func StartNetLab(nodes ...string) (*NetLab, error) {
	if err := NetLabSupported(); err != nil {
		return nil, fmt.Errorf("sandbox: netlab: %w", err)
	}
	if len(nodes) < 2 || len(nodes) > netLabMaxN {
		return nil, fmt.Errorf("sandbox: netlab: want 2..%d nodes, got %d", netLabMaxN, len(nodes))
	}
	var rb [3]byte
	if _, err := rand.Read(rb[:]); err != nil {
		return nil, fmt.Errorf("sandbox: netlab: %w", err)
	}
	l := &NetLab{id: hex.EncodeToString(rb[:]), index: make(map[string]int), cut: make(map[[2]int]bool)}
	for i, n := range nodes {
		if !nodeNameRE.MatchString(n) {
			return nil, fmt.Errorf("sandbox: netlab: bad node name %q", n)
		}
		if _, dup := l.index[n]; dup {
			return nil, fmt.Errorf("sandbox: netlab: duplicate node %q", n)
		}
		l.index[n] = i
	}
	// Leftovers of crashed runs would otherwise pile up; best effort.
	_, _ = SweepNetLabs()
	if err := l.build(nodes); err != nil {
		return nil, errors.Join(err, l.Close())
	}
	return l, nil
}

func (l *NetLab) build(nodes []string) error {
	if err := os.MkdirAll(netLabOwners, 0o755); err != nil {
		return fmt.Errorf("sandbox: netlab: %w", err)
	}
	for i, n := range nodes {
		ns := l.nsName(n)
		// Record the owner first: a crash between the two leaves a record
		// the sweeper ignores, never a namespace it cannot attribute.
		if err := os.WriteFile(filepath.Join(netLabOwners, ns), []byte(selfIdentity()), 0o644); err != nil {
			return fmt.Errorf("sandbox: netlab: %w", err)
		}
		if err := runIP("netns", "add", ns); err != nil {
			return err
		}
		l.nodes = append(l.nodes, n)
		ip := l.ipOf(i).String()
		if err := runIP("-n", ns, "link", "set", "lo", "up"); err != nil {
			return err
		}
		if err := runIP("-n", ns, "addr", "add", ip+"/32", "dev", "lo"); err != nil {
			return err
		}
	}
	for i := range nodes {
		for j := i + 1; j < len(nodes); j++ {
			if err := l.link(i, j); err != nil {
				return err
			}
		}
	}
	return nil
}

// link creates the veth pair between nodes i and j (created inside i's
// namespace with its peer inside j's) and their routes and neighbours.
func (l *NetLab) link(i, j int) error {
	nsI, nsJ := l.nsName(l.nodes[i]), l.nsName(l.nodes[j])
	if err := runIP("-n", nsI, "link", "add", "name", ifName(j), "address", macOf(i, j), "type", "veth",
		"peer", "name", ifName(i), "address", macOf(j, i), "netns", nsJ); err != nil {
		return err
	}
	for _, e := range [][2]int{{i, j}, {j, i}} {
		a, b := e[0], e[1]
		ns := l.nsName(l.nodes[a])
		if err := runIP("-n", ns, "link", "set", ifName(b), "up"); err != nil {
			return err
		}
		if err := runIP("-n", ns, "route", "replace", l.ipOf(b).String()+"/32", "dev", ifName(b), "src", l.ipOf(a).String()); err != nil {
			return err
		}
		if err := l.setNeigh(a, b, macOf(b, a)); err != nil {
			return err
		}
	}
	return nil
}

// setNeigh points a's neighbour entry for b's address at mac.
func (l *NetLab) setNeigh(a, b int, mac string) error {
	return runIP("-n", l.nsName(l.nodes[a]), "neigh", "replace", l.ipOf(b).String(),
		"lladdr", mac, "dev", ifName(b), "nud", "permanent")
}

func (l *NetLab) nsName(node string) string { return netLabPrefix + l.id + "-" + node }

func (l *NetLab) ipOf(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 213, 0, byte(i + 1)}) }

// ifName is the name, inside a node, of its veth towards node j.
func ifName(j int) string { return "ef-to-" + strconv.Itoa(j) }

// macOf is the MAC of node i's veth towards node j (locally administered).
func macOf(i, j int) string { return fmt.Sprintf("02:ef:00:00:%02x:%02x", i, j) }

func (l *NetLab) node(name string) (int, error) {
	i, ok := l.index[name]
	if !ok {
		return 0, fmt.Errorf("sandbox: netlab: no node %q", name)
	}
	return i, nil
}

// Nodes returns the node names in creation order.
func (l *NetLab) Nodes() []string { return append([]string(nil), l.nodes...) }

// NetNS returns the name of node's network namespace ("ef-<id>-<node>"), as
// `ip netns exec` takes it, or "" for an unknown node.
func (l *NetLab) NetNS(node string) string {
	if _, err := l.node(node); err != nil {
		return ""
	}
	return l.nsName(node)
}

// IP returns node's address, reachable from every other node it is not
// partitioned from, or the zero Addr for an unknown node.
func (l *NetLab) IP(node string) netip.Addr {
	i, err := l.node(node)
	if err != nil {
		return netip.Addr{}
	}
	return l.ipOf(i)
}

// HostPort returns "IP:port" for node's address.
func (l *NetLab) HostPort(node string, port int) string {
	return net.JoinHostPort(l.IP(node).String(), strconv.Itoa(port))
}

// Command returns a command that runs name with args inside node's
// namespace (`ip netns exec NS name args...`; ip execs the program, so the
// process is the program itself and can be signalled directly). The caller
// starts and waits for it as for exec.Command.
func (l *NetLab) Command(node, name string, args ...string) *exec.Cmd {
	return exec.Command(netLabIPBin, l.netnsExecArgs(node, name, args)...)
}

// CommandContext is Command with exec.CommandContext.
func (l *NetLab) CommandContext(ctx context.Context, node, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, netLabIPBin, l.netnsExecArgs(node, name, args)...)
}

// ExecArgs returns the argv (after the ip binary's path) that runs name in
// node's namespace, for starters that take a binary and arguments, such as
// StartProc(..., NetLabIP, lab.ExecArgs(node, bin, args...)...).
func (l *NetLab) ExecArgs(node, name string, args ...string) []string {
	return l.netnsExecArgs(node, name, args)
}

// NetLabIP is the path of the ip binary NetLab uses.
const NetLabIP = netLabIPBin

func (l *NetLab) netnsExecArgs(node, name string, args []string) []string {
	// An unknown node yields a namespace name ip rejects, so the error
	// surfaces at Start.
	return append([]string{"netns", "exec", l.nsName(node), name}, args...)
}

// Do runs fn on an OS thread switched into node's namespace. Sockets that
// fn creates belong to that namespace for their whole life, so fn can
// listen or dial there; fn must not start goroutines that expect to be in
// the namespace (new goroutines run on other threads).
func (l *NetLab) Do(node string, fn func() error) error {
	if _, err := l.node(node); err != nil {
		return err
	}
	target, err := os.Open(filepath.Join(netnsRunDir, l.nsName(node)))
	if err != nil {
		return fmt.Errorf("sandbox: netlab: %w", err)
	}
	defer target.Close()
	runtime.LockOSThread()
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("sandbox: netlab: %w", err)
	}
	defer orig.Close()
	if err := setns(target); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("sandbox: netlab: setns %s: %w", node, err)
	}
	fnErr := fn()
	if err := setns(orig); err != nil {
		// Leave the thread locked: the runtime retires it when this
		// goroutine exits instead of reusing a thread in the wrong
		// namespace.
		return errors.Join(fnErr, fmt.Errorf("sandbox: netlab: restore namespace: %w", err))
	}
	runtime.UnlockOSThread()
	return fnErr
}

func setns(f *os.File) error {
	return unix.Setns(int(f.Fd()), unix.CLONE_NEWNET)
}

// Listen listens on addr inside node's namespace ("" or ":0" host means the
// node's IP is reachable: bind to 0.0.0.0 or the node's IP).
func (l *NetLab) Listen(node, network, addr string) (net.Listener, error) {
	var ln net.Listener
	err := l.Do(node, func() error {
		var err error
		ln, err = net.Listen(network, addr)
		return err
	})
	return ln, err
}

// DialContext dials addr from inside node's namespace. Its signature fits
// grpc.WithContextDialer (with network "tcp") and paho's connection setup,
// so in-process clients can live in a node.
func (l *NetLab) DialContext(ctx context.Context, node, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := l.Do(node, func() error {
		var err error
		var d net.Dialer
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// Partition cuts the link between nodes a and b in both directions: their
// frames are dropped silently until Heal. Other links are unaffected.
func (l *NetLab) Partition(a, b string) error { return l.setCut(a, b, true) }

// Heal restores the link between a and b. Connections that were stalled,
// not timed out, resume.
func (l *NetLab) Heal(a, b string) error { return l.setCut(a, b, false) }

// Isolate partitions node from every other node.
func (l *NetLab) Isolate(node string) error {
	var errs []error
	for _, o := range l.nodes {
		if o != node {
			errs = append(errs, l.Partition(node, o))
		}
	}
	return errors.Join(errs...)
}

// HealAll restores every link.
func (l *NetLab) HealAll() error {
	var errs []error
	for i := range l.nodes {
		for j := i + 1; j < len(l.nodes); j++ {
			errs = append(errs, l.Heal(l.nodes[i], l.nodes[j]))
		}
	}
	return errors.Join(errs...)
}

// Partitioned reports whether the a–b link is cut.
func (l *NetLab) Partitioned(a, b string) bool {
	i, err1 := l.node(a)
	j, err2 := l.node(b)
	if err1 != nil || err2 != nil {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cut[pairKey(i, j)]
}

func pairKey(i, j int) [2]int {
	if i > j {
		i, j = j, i
	}
	return [2]int{i, j}
}

func (l *NetLab) setCut(a, b string, cut bool) error {
	i, err := l.node(a)
	if err != nil {
		return err
	}
	j, err := l.node(b)
	if err != nil {
		return err
	}
	if i == j {
		return fmt.Errorf("sandbox: netlab: %s with itself", a)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return ErrClosed
	}
	macIJ, macJI := macOf(j, i), macOf(i, j)
	if cut {
		macIJ, macJI = bogusMAC, bogusMAC
	}
	if err := errors.Join(l.setNeigh(i, j, macIJ), l.setNeigh(j, i, macJI)); err != nil {
		return err
	}
	l.cut[pairKey(i, j)] = cut
	return nil
}

// Close deletes the lab's namespaces (and with them its veths). It is
// idempotent and safe after a failed start.
func (l *NetLab) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	var errs []error
	for n := range l.index {
		ns := l.nsName(n)
		if _, err := os.Stat(filepath.Join(netnsRunDir, ns)); err == nil {
			errs = append(errs, runIP("netns", "delete", ns))
		}
		os.Remove(filepath.Join(netLabOwners, ns))
	}
	return errors.Join(errs...)
}

// SweepNetLabs deletes "ef-*" namespaces left behind by labs whose process
// is gone (a test killed by its timeout, a crash), and returns their names.
// Namespaces of labs in running processes, and "ef-*" namespaces without an
// owner record (not made by NetLab), are left alone.
func SweepNetLabs() ([]string, error) {
	ents, err := os.ReadDir(netnsRunDir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, fmt.Errorf("sandbox: netlab sweep: %w", err)
	}
	var removed []string
	var errs []error
	for _, e := range ents {
		ns := e.Name()
		if !strings.HasPrefix(ns, netLabPrefix) {
			continue
		}
		rec := filepath.Join(netLabOwners, ns)
		owner, err := os.ReadFile(rec)
		if err != nil || identityAlive(string(owner)) {
			continue
		}
		if err := runIP("netns", "delete", ns); err != nil {
			errs = append(errs, err)
			continue
		}
		os.Remove(rec)
		removed = append(removed, ns)
	}
	// Records of namespaces that were never created or are gone.
	if recs, err := os.ReadDir(netLabOwners); err == nil {
		for _, r := range recs {
			if _, err := os.Stat(filepath.Join(netnsRunDir, r.Name())); !errors.Is(err, os.ErrNotExist) {
				continue
			}
			if owner, err := os.ReadFile(filepath.Join(netLabOwners, r.Name())); err == nil && !identityAlive(string(owner)) {
				os.Remove(filepath.Join(netLabOwners, r.Name()))
			}
		}
	}
	return removed, errors.Join(errs...)
}

// selfIdentity is "PID STARTTIME": the start time (from /proc/PID/stat)
// tells a live owner from a recycled PID.
func selfIdentity() string {
	pid := os.Getpid()
	return strconv.Itoa(pid) + " " + procStartTime(pid)
}

func identityAlive(id string) bool {
	f := strings.Fields(id)
	if len(f) != 2 {
		return false
	}
	pid, err := strconv.Atoi(f[0])
	if err != nil {
		return false
	}
	st := procStartTime(pid)
	return st != "" && st == f[1]
}

// procStartTime returns field 22 of /proc/PID/stat, or "" if there is no
// such process.
func procStartTime(pid int) string {
	s, err := procstat.Read(pid)
	if err != nil {
		return ""
	}
	return strconv.FormatUint(s.StartTime, 10)
}

func runIP(args ...string) error {
	out, err := exec.Command(netLabIPBin, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("sandbox: netlab: ip %s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}
