package sandbox

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Proc is a child process of a scenario: an agent or a device simulator run
// from its real binary, so that it can be frozen (SIGSTOP), resumed and
// killed like on a gateway.
type Proc struct {
	Name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error

	mu    sync.Mutex
	lines []string // stderr lines, for readiness checks and failure reports
	seen  *sync.Cond
}

// StartProc starts bin with args; its stderr is kept in memory and copied to
// logPath (appended).
func StartProc(name, logPath string, env []string, bin string, args ...string) (*Proc, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout = logf
	stderr, err := cmd.StderrPipe()
	if err != nil {
		logf.Close()
		return nil, err
	}
	setParentDeathSignal(cmd)
	p := &Proc{Name: name, cmd: cmd, done: make(chan struct{})}
	p.seen = sync.NewCond(&p.mu)
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(logf, line)
			p.mu.Lock()
			p.lines = append(p.lines, line)
			p.seen.Broadcast()
			p.mu.Unlock()
		}
		_, _ = io.Copy(io.Discard, stderr)
		p.err = cmd.Wait()
		logf.Close()
		p.mu.Lock()
		close(p.done)
		p.seen.Broadcast()
		p.mu.Unlock()
	}()
	return p, nil
}

// Pid returns the process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Done is closed when the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// WaitLine waits until a stderr line contains substr, or any of or.
func (p *Proc) WaitLine(ctx context.Context, substr string, or ...string) error {
	want := append([]string{substr}, or...)
	stop := context.AfterFunc(ctx, func() {
		p.mu.Lock()
		p.seen.Broadcast()
		p.mu.Unlock()
	})
	defer stop()
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := 0; ; {
		for ; i < len(p.lines); i++ {
			for _, w := range want {
				if strings.Contains(p.lines[i], w) {
					return nil
				}
			}
		}
		select {
		case <-p.done:
			return fmt.Errorf("%s exited (%v) before %q; last output:\n%s", p.Name, p.err, want, p.tailLocked(20))
		default:
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%s: waiting for %q: %w; last output:\n%s", p.Name, want, ctx.Err(), p.tailLocked(20))
		}
		p.seen.Wait()
	}
}

// ownFrames returns up to n stderr lines of a goroutine dump that name
// edgefence code (with the goroutine headers before them).
func (p *Proc) ownFrames(n int) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	header := ""
	for _, l := range p.lines {
		switch {
		case strings.HasPrefix(l, "goroutine "):
			header = l
		case strings.Contains(l, "github.com/edgefence/edgefence/") && len(out) < n:
			if header != "" {
				out = append(out, header)
				header = ""
			}
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func (p *Proc) tailLocked(n int) string {
	l := p.lines
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}

// Freeze stops the process with SIGSTOP: it keeps its sockets and memory but
// runs no instruction, like a long GC pause or a throttled container.
func (p *Proc) Freeze() error { return p.signal(syscall.SIGSTOP) }

// Resume continues a frozen process with SIGCONT.
func (p *Proc) Resume() error { return p.signal(syscall.SIGCONT) }

// Kill kills the process with SIGKILL and waits for it.
func (p *Proc) Kill() error {
	if err := p.signal(syscall.SIGKILL); err != nil {
		return err
	}
	<-p.done
	return nil
}

func (p *Proc) signal(sig syscall.Signal) error {
	select {
	case <-p.done:
		return fmt.Errorf("%s: already exited", p.Name)
	default:
	}
	if err := p.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("%s: %v: %w", p.Name, sig, err)
	}
	return nil
}

// Stop asks the process to exit (SIGCONT, then SIGTERM) and kills it if it
// has not exited within grace. It returns the process's exit error, if any.
func (p *Proc) Stop(grace time.Duration) error {
	select {
	case <-p.done:
		return p.err
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGCONT)
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.done:
		return p.err
	case <-t.C:
		// A Go process dumps its goroutines on SIGQUIT: keep the frames
		// of our own code, which say where the shutdown hangs.
		_ = p.cmd.Process.Signal(syscall.SIGQUIT)
		select {
		case <-p.done:
		case <-time.After(3 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		return errors.Join(fmt.Errorf("%s: no exit within %v of SIGTERM; its goroutines in edgefence code:\n%s", p.Name, grace, p.ownFrames(60)), p.err)
	}
}
