package procstat

import (
	"errors"
	"os"
	"testing"
	"time"

	"github.com/edgefence/edgefence/internal/cputime"
)

func TestParse(t *testing.T) {
	for _, c := range []struct {
		name, stat string
		ok         bool
	}{
		{"spaces and parens in comm", "42 (a) b) (c) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 7 0 1234 10000000 300 18446744073709551615", true},
		{"short", "42 (x) S 1 2 3", false},
		{"no comm", "42 x S", false},
		{"not a number", "42 (x) S 1 42 42 0 -1 4194560 100 0 0 0 2x0 50 0 0 20 0 7 0 1234 10000000 300", false},
	} {
		s, err := Parse([]byte(c.stat + "\n"))
		if (err == nil) != c.ok {
			t.Errorf("%s: err %v", c.name, err)
			continue
		}
		if err != nil && !errors.Is(err, ErrFormat) {
			t.Errorf("%s: %v is not ErrFormat", c.name, err)
		}
		if c.ok && (s != Stat{UTime: 250, STime: 50, StartTime: 1234, VSize: 10000000, RSS: 300}) {
			t.Errorf("%s: %+v", c.name, s)
		}
		if c.ok && s.CPU() != 3*time.Second {
			t.Errorf("%s: CPU %v, want 3s", c.name, s.CPU())
		}
	}
}

// TestSelf: this process's stat as the kernel writes it, its CPU within a
// few ticks of getrusage's, and Read(pid) the same process.
func TestSelf(t *testing.T) {
	for x := 0; cputime.Process() < 50*time.Millisecond; x++ {
	}
	s, err := Self()
	if err != nil {
		t.Fatal(err)
	}
	if d := cputime.Process() - s.CPU(); s.CPU() <= 0 || d < 0 || d > 100*time.Millisecond {
		t.Errorf("CPU %v, getrusage %v", s.CPU(), cputime.Process())
	}
	if s.StartTime == 0 || s.VSize == 0 || s.RSS == 0 {
		t.Errorf("%+v", s)
	}
	p, err := Read(os.Getpid())
	if err != nil || p.StartTime != s.StartTime {
		t.Errorf("Read(self) = %+v, %v; Self %+v", p, err, s)
	}
	if _, err := Read(-1); err == nil {
		t.Error("Read(-1): no error")
	}
}
