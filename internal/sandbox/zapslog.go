package sandbox

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// newZapLogger returns a zap logger that forwards entries at floor or above to
// lg's handler, or a no-op logger when lg is nil. It exists so that embedded
// etcd, which logs through zap, honours the slog.Logger the caller injected.
// While *quiet is true (set when we stop the server, whose listeners then
// report "use of closed network connection" as errors) and for a few
// warnings that are expected in a sandbox, entries are logged at debug level.
func newZapLogger(lg *slog.Logger, floor zapcore.Level, quiet *atomic.Bool) *zap.Logger {
	if lg == nil {
		return zap.NewNop()
	}
	return zap.New(&slogCore{h: lg.Handler(), floor: floor, quiet: quiet})
}

// expectedWarning reports whether msg is an etcd warning that says nothing
// about a loopback single-node sandbox; those are logged at debug level.
func expectedWarning(msg string) bool {
	for _, s := range []string{
		"Running http and grpc server on single port",
		"simple token is not cryptographically signed",
		"cannot campaign at term 1 since there are still pending configuration changes",
		// A bootstrap race in etcd 3.6+ (etcd-io/etcd#18978): the storage
		// version monitor runs before the first term is persisted.
		"Failed to detect schema version",
		"failed to update storage version",
	} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

// slogCore is a zapcore.Core writing to a slog.Handler.
type slogCore struct {
	h     slog.Handler
	floor zapcore.Level
	quiet *atomic.Bool
}

// Enabled filters on the entry's own level; Write may still drop it after
// demoting it to debug.
func (c *slogCore) Enabled(l zapcore.Level) bool {
	return l >= c.floor && c.h.Enabled(context.Background(), slogLevel(l))
}

func (c *slogCore) With(fields []zapcore.Field) zapcore.Core {
	return &slogCore{h: c.h.WithAttrs(attrs(fields)), floor: c.floor, quiet: c.quiet}
}

func (c *slogCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c *slogCore) Write(e zapcore.Entry, fields []zapcore.Field) error {
	level := slogLevel(e.Level)
	if (c.quiet != nil && c.quiet.Load()) || expectedWarning(e.Message) {
		level = slog.LevelDebug
	}
	if !c.h.Enabled(context.Background(), level) {
		return nil
	}
	r := slog.NewRecord(e.Time, level, e.Message, 0)
	if e.LoggerName != "" {
		r.AddAttrs(slog.String("logger", e.LoggerName))
	}
	r.AddAttrs(attrs(fields)...)
	return c.h.Handle(context.Background(), r)
}

func (c *slogCore) Sync() error { return nil }

func slogLevel(l zapcore.Level) slog.Level {
	switch {
	case l <= zapcore.DebugLevel:
		return slog.LevelDebug
	case l == zapcore.InfoLevel:
		return slog.LevelInfo
	case l == zapcore.WarnLevel:
		return slog.LevelWarn
	default: // error, dpanic, panic, fatal
		return slog.LevelError + slog.Level(l-zapcore.ErrorLevel)
	}
}

func attrs(fields []zapcore.Field) []slog.Attr {
	if len(fields) == 0 {
		return nil
	}
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range fields {
		f.AddTo(enc)
	}
	out := make([]slog.Attr, 0, len(enc.Fields))
	for _, f := range fields { // keep the caller's order
		if v, ok := enc.Fields[f.Key]; ok {
			out = append(out, slog.Any(f.Key, v))
			delete(enc.Fields, f.Key)
		}
	}
	return out
}
