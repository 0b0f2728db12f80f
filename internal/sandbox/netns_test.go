//go:build linux

package sandbox

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// echoServer accepts on ln and echoes lines until ln is closed; the
// returned function closes ln and every connection and waits.
func echoServer(t *testing.T, ln net.Listener) {
	t.Helper()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
}

// dialFrom dials addr from node with a short timeout.
func dialFrom(lab *NetLab, node, addr string, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return lab.DialContext(ctx, node, "tcp", addr)
}

func TestNetLabPartitionHeal(t *testing.T) {
	lab := NewNetLab(t, "a", "b", "c")
	for _, n := range lab.Nodes() {
		if _, err := os.Stat(filepath.Join(netnsRunDir, lab.NetNS(n))); err != nil {
			t.Fatalf("namespace of %s: %v", n, err)
		}
	}
	lnB, err := lab.Listen("b", "tcp", lab.HostPort("b", 7000))
	if err != nil {
		t.Fatal(err)
	}
	echoServer(t, lnB)
	lnA, err := lab.Listen("a", "tcp", lab.HostPort("a", 7000))
	if err != nil {
		t.Fatal(err)
	}
	echoServer(t, lnA)
	addrB, addrA := lab.HostPort("b", 7000), lab.HostPort("a", 7000)

	// Connected: a ↔ b both ways, c → b.
	for _, d := range []struct{ from, addr string }{{"a", addrB}, {"b", addrA}, {"c", addrB}} {
		c, err := dialFrom(lab, d.from, d.addr, 2*time.Second)
		if err != nil {
			t.Fatalf("%s → %s before partition: %v", d.from, d.addr, err)
		}
		c.Close()
	}
	// An established a → b connection, to watch it stall and resume.
	conn, err := dialFrom(lab, "a", addrB, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rd := bufio.NewReader(conn)
	echo := func(msg string, wait time.Duration) error {
		if _, err := conn.Write([]byte(msg + "\n")); err != nil {
			return err
		}
		conn.SetReadDeadline(time.Now().Add(wait))
		line, err := rd.ReadString('\n')
		if err != nil {
			return err
		}
		if line != msg+"\n" {
			t.Fatalf("echo %q, want %q", line, msg)
		}
		return nil
	}
	if err := echo("before", 2*time.Second); err != nil {
		t.Fatal(err)
	}

	if err := lab.Partition("a", "b"); err != nil {
		t.Fatal(err)
	}
	if !lab.Partitioned("b", "a") || lab.Partitioned("a", "c") {
		t.Fatal("Partitioned reports the wrong links")
	}
	start := time.Now()
	for _, d := range []struct{ from, addr string }{{"a", addrB}, {"b", addrA}} {
		c, err := dialFrom(lab, d.from, d.addr, 500*time.Millisecond)
		if err == nil {
			c.Close()
			t.Fatalf("%s → %s dialled through a partition", d.from, d.addr)
		}
		if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
			t.Fatalf("%s → %s: %v, want a silent timeout", d.from, d.addr, err)
		}
	}
	t.Logf("dials across the partition timed out (%v for both)", time.Since(start))
	// The established connection stalls: no reset, no echo.
	var ne net.Error
	if err := echo("during", 500*time.Millisecond); !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("echo across the partition: %v, want a timeout", err)
	}
	// Other links still work.
	if c, err := dialFrom(lab, "c", addrB, 2*time.Second); err != nil {
		t.Fatalf("c → b during the a–b partition: %v", err)
	} else {
		c.Close()
	}

	if err := lab.Heal("a", "b"); err != nil {
		t.Fatal(err)
	}
	if c, err := dialFrom(lab, "a", addrB, 2*time.Second); err != nil {
		t.Fatalf("a → b after heal: %v", err)
	} else {
		c.Close()
	}
	// The stalled connection resumes: TCP retransmits the queued line.
	start = time.Now()
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	line, err := rd.ReadString('\n')
	if err != nil || line != "during\n" {
		t.Fatalf("stalled echo after heal: %q, %v", line, err)
	}
	t.Logf("stalled connection resumed %v after heal", time.Since(start))

	// Isolate and HealAll.
	if err := lab.Isolate("c"); err != nil {
		t.Fatal(err)
	}
	if c, err := dialFrom(lab, "c", addrB, 300*time.Millisecond); err == nil {
		c.Close()
		t.Fatal("isolated node dialled out")
	}
	if err := lab.HealAll(); err != nil {
		t.Fatal(err)
	}
	if c, err := dialFrom(lab, "c", addrB, 2*time.Second); err != nil {
		t.Fatalf("c → b after HealAll: %v", err)
	} else {
		c.Close()
	}
}

func TestNetLabCommandAndClose(t *testing.T) {
	lab, err := StartNetLab("x", "y")
	if err != nil {
		if NetLabSupported() != nil && os.Getenv("CI") != "true" {
			t.Skip(err)
		}
		t.Fatal(err)
	}
	defer lab.Close()
	out, err := lab.Command("x", NetLabIP, "-br", "addr", "show", "dev", "lo").CombinedOutput()
	if err != nil {
		t.Fatalf("command in x: %v: %s", err, out)
	}
	if !strings.Contains(string(out), lab.IP("x").String()+"/32") {
		t.Fatalf("lo in x: %s", out)
	}
	// The root namespace has none of the lab's addresses or interfaces.
	root, err := exec0(NetLabIP, "-br", "addr")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(root, "10.213.") || strings.Contains(root, "ef-to-") {
		t.Fatalf("root namespace touched:\n%s", root)
	}
	if _, err := StartNetLab("x"); err == nil {
		t.Fatal("a one-node lab started")
	}
	if _, err := StartNetLab("x", "x"); err == nil {
		t.Fatal("duplicate node names accepted")
	}
	if _, err := StartNetLab("x", "Bad_Name"); err == nil {
		t.Fatal("bad node name accepted")
	}
	if err := lab.Partition("x", "nope"); err == nil {
		t.Fatal("partition with an unknown node")
	}
	names := []string{lab.NetNS("x"), lab.NetNS("y")}
	if err := lab.Close(); err != nil {
		t.Fatal(err)
	}
	if err := lab.Close(); err != nil { // idempotent
		t.Fatal(err)
	}
	for _, ns := range names {
		if _, err := os.Stat(filepath.Join(netnsRunDir, ns)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("namespace %s left after Close: %v", ns, err)
		}
	}
	if err := lab.Heal("x", "y"); !errors.Is(err, ErrClosed) {
		t.Fatalf("Heal after Close = %v", err)
	}
}

// TestSweepNetLabs plants a namespace owned by a dead process and checks
// the sweeper removes it and leaves a live lab alone.
func TestSweepNetLabs(t *testing.T) {
	lab := NewNetLab(t, "p", "q")
	ns := netLabPrefix + "deadbeef-orphan"
	if err := runIP("netns", "add", ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = runIP("netns", "delete", ns) })
	// PID 1's identity with a wrong start time: a recycled PID.
	if err := os.WriteFile(filepath.Join(netLabOwners, ns), []byte("1 0"), 0o644); err != nil {
		t.Fatal(err)
	}
	removed, err := SweepNetLabs()
	if err != nil {
		t.Fatal(err)
	}
	if len(removed) != 1 || removed[0] != ns {
		t.Fatalf("swept %v, want [%s]", removed, ns)
	}
	if _, err := os.Stat(filepath.Join(netnsRunDir, lab.NetNS("p"))); err != nil {
		t.Fatalf("live lab swept: %v", err)
	}
}

func exec0(name string, args ...string) (string, error) {
	out, err := execCommand(name, args...).CombinedOutput()
	return string(out), err
}

var execCommand = exec.Command
