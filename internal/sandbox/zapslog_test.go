package sandbox

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

func TestZapToSlog(t *testing.T) {
	var buf bytes.Buffer
	lg := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{
		Level: slog.LevelInfo,
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		},
	}))
	quiet := new(atomic.Bool)
	z := newZapLogger(lg, zapcore.WarnLevel, quiet).Named("raft").With(zap.String("member", "m1"))

	z.Info("chatty")                                             // below min
	z.Warn("disk slow", zap.Int("ms", 120), zap.Bool("x", true)) // kept
	z.Warn("simple token is not cryptographically signed")       // expected: debug
	z.Error("boom", zap.Error(errors.New("bad")))                // kept
	quiet.Store(true)
	z.Error("accept: use of closed network connection") // stopping: debug

	want := strings.Join([]string{
		`level=WARN msg="disk slow" member=m1 logger=raft ms=120 x=true`,
		`level=ERROR msg=boom member=m1 logger=raft error=bad`,
		``,
	}, "\n")
	if got := buf.String(); got != want {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}

	if newZapLogger(nil, zapcore.WarnLevel, nil).Core().Enabled(zapcore.FatalLevel) {
		t.Fatal("nil slog logger should give a no-op zap logger")
	}
}
