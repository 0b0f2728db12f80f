package fence_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/edgefence/edgefence/fence"
)

func TestAdmit(t *testing.T) {
	mark := fence.Mark{Token: 9, Seq: 3}
	tests := []struct {
		name  string
		m     fence.Mark
		tok   fence.Token
		seq   uint64
		want  fence.Verdict
		after fence.Mark
	}{
		// Invalid: zero token or seq never moves the mark, whatever the mark is.
		{"token 0", mark, 0, 4, fence.Invalid, mark},
		{"seq 0", mark, 9, 0, fence.Invalid, mark},
		{"token 0 seq 0", mark, 0, 0, fence.Invalid, mark},
		{"seq 0 higher token", mark, 10, 0, fence.Invalid, mark},
		{"token 0 on fresh point", fence.Mark{}, 0, 1, fence.Invalid, fence.Mark{}},
		{"seq 0 on fresh point", fence.Mark{}, 1, 0, fence.Invalid, fence.Mark{}},

		// A fresh fence point (zero mark) accepts any valid command.
		{"fresh point", fence.Mark{}, 1, 1, fence.Accepted, fence.Mark{Token: 1, Seq: 1}},
		{"fresh point high seq", fence.Mark{}, 42, 17, fence.Accepted, fence.Mark{Token: 42, Seq: 17}},

		// Higher token: a new holder. Accepted with any seq; its seqs restart.
		{"higher token seq restart at 1", mark, 10, 1, fence.Accepted, fence.Mark{Token: 10, Seq: 1}},
		{"higher token lower seq", mark, 10, 2, fence.Accepted, fence.Mark{Token: 10, Seq: 2}},
		{"higher token equal seq", mark, 10, 3, fence.Accepted, fence.Mark{Token: 10, Seq: 3}},
		{"higher token higher seq", mark, 10, 99, fence.Accepted, fence.Mark{Token: 10, Seq: 99}},
		{"much higher token", mark, 1 << 62, 1, fence.Accepted, fence.Mark{Token: 1 << 62, Seq: 1}},
		{"max token max seq", mark, ^fence.Token(0), ^uint64(0), fence.Accepted, fence.Mark{Token: ^fence.Token(0), Seq: ^uint64(0)}},

		// Lower token: a superseded holder. Stale whatever its seq.
		{"lower token seq 1", mark, 8, 1, fence.Stale, mark},
		{"lower token higher seq", mark, 8, 1000, fence.Stale, mark},
		{"lower token max seq", mark, 8, ^uint64(0), fence.Stale, mark},
		{"token 1 below mark", mark, 1, 1, fence.Stale, mark},

		// Same token: ordered by seq.
		{"equal token next seq", mark, 9, 4, fence.Accepted, fence.Mark{Token: 9, Seq: 4}},
		{"equal token seq gap", mark, 9, 10, fence.Accepted, fence.Mark{Token: 9, Seq: 10}},
		{"equal token equal seq", mark, 9, 3, fence.Duplicate, mark},
		{"equal token lower seq", mark, 9, 2, fence.Duplicate, mark},
		{"equal token seq 1", mark, 9, 1, fence.Duplicate, mark},
		{"max mark equal", fence.Mark{Token: ^fence.Token(0), Seq: ^uint64(0)}, ^fence.Token(0), ^uint64(0), fence.Duplicate, fence.Mark{Token: ^fence.Token(0), Seq: ^uint64(0)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, after := fence.Admit(tt.m, tt.tok, tt.seq)
			if v != tt.want || after != tt.after {
				t.Errorf("Admit(%v, %d, %d) = %v, %v; want %v, %v", tt.m, tt.tok, tt.seq, v, after, tt.want, tt.after)
			}
			if v != fence.Accepted && after != tt.m {
				t.Errorf("verdict %v moved the mark from %v to %v", v, tt.m, after)
			}
		})
	}
}

func TestAdmitSequence(t *testing.T) {
	// One fence point, one timeline; each step sees the mark left by the previous one.
	steps := []struct {
		tok  fence.Token
		seq  uint64
		want fence.Verdict
		mark string
	}{
		{7, 1, fence.Accepted, "7/1"},
		{7, 2, fence.Accepted, "7/2"},
		{7, 2, fence.Duplicate, "7/2"}, // redelivery
		{9, 1, fence.Accepted, "9/1"},  // new holder, seq restarts
		{7, 3, fence.Stale, "9/1"},     // old holder woke up
		{9, 1, fence.Duplicate, "9/1"},
		{0, 1, fence.Invalid, "9/1"},
		{9, 0, fence.Invalid, "9/1"},
		{9, 5, fence.Accepted, "9/5"},
		{8, 9, fence.Stale, "9/5"},
		{12, 1, fence.Accepted, "12/1"},
		{9, 6, fence.Stale, "12/1"},
	}
	var m fence.Mark
	for i, s := range steps {
		var v fence.Verdict
		v, m = fence.Admit(m, s.tok, s.seq)
		if v != s.want || m.String() != s.mark {
			t.Fatalf("step %d: Admit(%d, %d) = %v, mark %v; want %v, mark %s", i, s.tok, s.seq, v, m, s.want, s.mark)
		}
	}
}

func TestAdmitAllocs(t *testing.T) {
	m := fence.Mark{Token: 5, Seq: 5}
	allocs := testing.AllocsPerRun(1000, func() {
		_, m = fence.Admit(m, m.Token, m.Seq+1)
	})
	if allocs != 0 {
		t.Errorf("Admit allocates %v times per call, want 0", allocs)
	}
}

func TestMarkString(t *testing.T) {
	for _, tt := range []struct {
		m    fence.Mark
		want string
	}{
		{fence.Mark{}, "0/0"},
		{fence.Mark{Token: 7, Seq: 3}, "7/3"},
		{fence.Mark{Token: ^fence.Token(0), Seq: ^uint64(0)}, "18446744073709551615/18446744073709551615"},
	} {
		if got := tt.m.String(); got != tt.want {
			t.Errorf("%#v.String() = %q, want %q", tt.m, got, tt.want)
		}
	}
}

var allVerdicts = []struct {
	v    fence.Verdict
	name string
	err  error
}{
	{fence.Accepted, "accepted", nil},
	{fence.Duplicate, "duplicate", fence.ErrDuplicate},
	{fence.Stale, "stale", fence.ErrStale},
	{fence.Invalid, "invalid", fence.ErrInvalid},
	{fence.Expired, "expired", fence.ErrExpired},
	{fence.Unknown, "unknown", fence.ErrUnknown},
}

func TestVerdict(t *testing.T) {
	for _, tt := range allVerdicts {
		t.Run(tt.name, func(t *testing.T) {
			if !tt.v.Valid() {
				t.Errorf("Valid() = false")
			}
			if got := tt.v.String(); got != tt.name {
				t.Errorf("String() = %q, want %q", got, tt.name)
			}
			text, err := tt.v.MarshalText()
			if err != nil || string(text) != tt.name {
				t.Fatalf("MarshalText() = %q, %v; want %q", text, err, tt.name)
			}
			var back fence.Verdict
			if err := back.UnmarshalText(text); err != nil || back != tt.v {
				t.Errorf("UnmarshalText(%q) = %v, %v; want %v", text, back, err, tt.v)
			}
			err = tt.v.Err()
			if err != tt.err {
				t.Errorf("Err() = %v, want %v", err, tt.err)
			}
			if tt.err != nil && !errors.Is(fmt.Errorf("send: %w", err), tt.err) {
				t.Errorf("errors.Is(wrapped Err(), %v) = false", tt.err)
			}
		})
	}
}

func TestVerdictErrDistinct(t *testing.T) {
	// Each sentinel matches its own verdict only.
	for _, a := range allVerdicts {
		for _, b := range allVerdicts {
			if b.err == nil {
				continue
			}
			got := errors.Is(a.v.Err(), b.err)
			if want := a.v == b.v; got != want {
				t.Errorf("errors.Is(%v.Err(), %v) = %v, want %v", a.v, b.err, got, want)
			}
		}
	}
}

func TestVerdictUndefined(t *testing.T) {
	for _, v := range []fence.Verdict{0, 7, 8, 255} {
		if v.Valid() {
			t.Errorf("Verdict(%d).Valid() = true", v)
		}
		if got, want := v.String(), fmt.Sprintf("verdict(%d)", v); got != want {
			t.Errorf("Verdict(%d).String() = %q, want %q", v, got, want)
		}
		if b, err := v.MarshalText(); err == nil {
			t.Errorf("Verdict(%d).MarshalText() = %q, want error", v, b)
		}
		if err := v.Err(); !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("Verdict(%d).Err() = %v, want ErrInvalid", v, err)
		}
	}
}

func TestVerdictUnmarshalTextRejects(t *testing.T) {
	for _, s := range []string{"", "Accepted", "ACCEPTED", " stale", "stale ", "verdict(0)", "verdict(1)", "0", "1", "Unknown", "fate unknown", "accepted\x00"} {
		v := fence.Stale
		if err := v.UnmarshalText([]byte(s)); err == nil {
			t.Errorf("UnmarshalText(%q) = nil error, verdict %v", s, v)
		}
		if v != fence.Stale {
			t.Errorf("UnmarshalText(%q) failed but changed the verdict to %v", s, v)
		}
	}
}

func TestVerdictJSON(t *testing.T) {
	type rec struct {
		Verdict fence.Verdict `json:"verdict"`
	}
	for _, tt := range allVerdicts {
		b, err := json.Marshal(rec{tt.v})
		if err != nil {
			t.Fatal(err)
		}
		if want := `{"verdict":"` + tt.name + `"}`; string(b) != want {
			t.Errorf("json.Marshal = %s, want %s", b, want)
		}
		var back rec
		if err := json.Unmarshal(b, &back); err != nil || back.Verdict != tt.v {
			t.Errorf("json.Unmarshal(%s) = %v, %v", b, back.Verdict, err)
		}
	}
	if _, err := json.Marshal(rec{0}); err == nil {
		t.Error("json.Marshal of the zero verdict succeeded")
	}
	var r rec
	if err := json.Unmarshal([]byte(`{"verdict":"bogus"}`), &r); err == nil {
		t.Error("json.Unmarshal of an unknown verdict succeeded")
	}
}

func TestAckErr(t *testing.T) {
	for _, tt := range allVerdicts {
		t.Run(tt.name, func(t *testing.T) {
			a := fence.Ack{V: fence.Version, Device: "d1", ID: "c1", Verdict: tt.v}
			if tt.err == nil {
				if err := a.Err(); err != nil {
					t.Fatalf("Err() = %v, want nil", err)
				}
				a.Reason = "ignored for accepted"
				if err := a.Err(); err != nil {
					t.Fatalf("Err() with reason = %v, want nil", err)
				}
				return
			}
			if err := a.Err(); err != tt.err {
				t.Errorf("Err() without reason = %v, want the bare sentinel %v", err, tt.err)
			}
			a.Reason = "mark is 9/3"
			err := a.Err()
			if !errors.Is(err, tt.err) {
				t.Errorf("errors.Is(%v, %v) = false", err, tt.err)
			}
			if !strings.Contains(err.Error(), a.Reason) || !strings.Contains(err.Error(), tt.err.Error()) {
				t.Errorf("Err() = %q, want it to carry the sentinel and the reason %q", err, a.Reason)
			}
		})
	}
	a := fence.Ack{V: fence.Version, Verdict: 0, Reason: "r"}
	if err := a.Err(); !errors.Is(err, fence.ErrInvalid) {
		t.Errorf("zero verdict: Err() = %v, want ErrInvalid", err)
	}
}

func TestNewAck(t *testing.T) {
	env := &fence.Envelope{V: fence.Version, Device: "d1", Token: 7, Seq: 2, ID: "c1", Kind: "set"}
	m := fence.Mark{Token: 9, Seq: 1}
	a := fence.NewAck(env, fence.Stale, m, "superseded")
	want := fence.Ack{V: fence.Version, Device: "d1", ID: "c1", Verdict: fence.Stale,
		Token: 7, Seq: 2, MaxToken: 9, LastSeq: 1, Reason: "superseded"}
	if a != want {
		t.Errorf("NewAck = %+v, want %+v", a, want)
	}
	if a.Mark() != m {
		t.Errorf("Mark() = %v, want %v", a.Mark(), m)
	}
	if err := a.Validate(); err != nil {
		t.Errorf("Validate() = %v", err)
	}
}

func TestNewAckTruncatesReason(t *testing.T) {
	env := &fence.Envelope{V: fence.Version, Device: "d1", Token: 7, Seq: 2, ID: "c1", Kind: "set"}
	for _, reason := range []string{
		strings.Repeat("x", fence.MaxReasonLen),
		strings.Repeat("x", fence.MaxReasonLen+1),
		strings.Repeat("é", fence.MaxReasonLen),       // 2-byte runes, cut falls on a boundary
		"x" + strings.Repeat("é", fence.MaxReasonLen), // cut falls inside a rune
		"xx" + strings.Repeat("€", fence.MaxReasonLen),
		"x" + strings.Repeat("😀", fence.MaxReasonLen),
	} {
		a := fence.NewAck(env, fence.Invalid, fence.Mark{}, reason)
		if len(a.Reason) > fence.MaxReasonLen || len(a.Reason) < fence.MaxReasonLen-3 {
			t.Errorf("reason of %d bytes truncated to %d bytes", len(reason), len(a.Reason))
		}
		if !strings.HasPrefix(reason, a.Reason) {
			t.Errorf("truncated reason is not a prefix of the original")
		}
		if err := a.Validate(); err != nil {
			t.Errorf("NewAck with a %d-byte reason: Validate() = %v", len(reason), err)
		}
		if _, err := fence.MarshalAck(&a); err != nil {
			t.Errorf("NewAck with a %d-byte reason: MarshalAck: %v", len(reason), err)
		}
	}
}

// AdmitEpoch compares the epoch before the token: a command of a closed
// epoch is stale and one of an epoch the fence point does not hold is
// invalid, whatever their tokens; within the epoch the token rule holds
// against the mark accepted in it, and a mark of an earlier epoch counts
// as none.
func TestAdmitEpoch(t *testing.T) {
	in5 := fence.State{Epoch: 5, Mark: fence.Mark{Token: 900, Seq: 3}}
	none7 := fence.State{Epoch: 7}
	tests := []struct {
		name   string
		e      uint64
		cur    fence.State
		epoch  uint64
		tok    fence.Token
		seq    uint64
		want   fence.Verdict
		err    error
		after  fence.State
		reason string
	}{
		{"same epoch, higher token", 0, in5, 5, 901, 1, fence.Accepted, nil, fence.State{Epoch: 5, Mark: fence.Mark{Token: 901, Seq: 1}}, ""},
		{"same epoch, lower token", 0, in5, 5, 899, 9, fence.Stale, nil, in5, ""},
		{"same epoch, duplicate", 0, in5, 5, 900, 3, fence.Duplicate, nil, in5, ""},
		{"closed epoch, higher token", 0, in5, 4, 1 << 62, 1, fence.Stale, fence.ErrEpochClosed, in5, "epoch 4 closed: the fence point is at epoch 5"},
		{"unknown epoch", 0, in5, 6, 1, 1, fence.Invalid, fence.ErrUnknownEpoch, in5, "unknown epoch 6: the fence point is at epoch 5"},
		{"raised past the mark: low token", 7, in5, 7, 2, 1, fence.Accepted, nil, fence.State{Epoch: 7, Mark: fence.Mark{Token: 2, Seq: 1}}, ""},
		{"raised past the mark: the mark's epoch closed", 7, in5, 5, 901, 1, fence.Stale, fence.ErrEpochClosed, none7, "epoch 5 closed: the fence point is at epoch 7"},
		{"raised past the mark: epoch 0", 7, in5, 0, 901, 1, fence.Stale, fence.ErrEpochClosed, none7, "epoch 0 closed: the fence point is at epoch 7"},
		{"own epoch below the mark's", 3, in5, 5, 899, 1, fence.Stale, nil, in5, ""},
		{"own epoch below the mark's: its epoch closed", 3, in5, 3, 901, 1, fence.Stale, fence.ErrEpochClosed, in5, "epoch 3 closed: the fence point is at epoch 5"},
		{"fresh, epoch 0", 0, fence.State{}, 0, 1, 1, fence.Accepted, nil, fence.State{Mark: fence.Mark{Token: 1, Seq: 1}}, ""},
		{"fresh, unknown epoch", 0, fence.State{}, 1, 1, 1, fence.Invalid, fence.ErrUnknownEpoch, fence.State{}, "unknown epoch 1: the fence point is at epoch 0"},
		{"token 0, closed epoch", 7, in5, 1, 0, 1, fence.Invalid, nil, none7, ""},
		{"seq 0, unknown epoch", 0, in5, 9, 901, 0, fence.Invalid, nil, in5, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, after, err := fence.AdmitEpoch(tt.e, tt.cur, tt.epoch, tt.tok, tt.seq)
			if v != tt.want || after != tt.after || !errors.Is(err, tt.err) || (tt.err == nil) != (err == nil) {
				t.Fatalf("AdmitEpoch(%d, %v, %d, %d, %d) = %v, %v, %v; want %v, %v, %v", tt.e, tt.cur, tt.epoch, tt.tok, tt.seq, v, after, err, tt.want, tt.after, tt.err)
			}
			if err != nil && err.Error() != tt.reason {
				t.Fatalf("reason %q, want %q", err, tt.reason)
			}
			if err != nil && !errors.Is(err, v.Err()) {
				t.Fatalf("error %v is not a %v", err, v)
			}
		})
	}
	if !errors.Is(fence.ErrEpochClosed, fence.ErrStale) || !errors.Is(fence.ErrUnknownEpoch, fence.ErrInvalid) ||
		errors.Is(fence.ErrEpochClosed, fence.ErrInvalid) || errors.Is(fence.ErrUnknownEpoch, fence.ErrStale) {
		t.Fatal("epoch sentinels are not kinds of the verdicts' sentinels")
	}
}
