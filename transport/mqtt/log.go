package mqtt

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
)

// pahoLogger adapts paho's Println/Printf logger to slog. Formatting is
// skipped when the level is disabled.
type pahoLogger struct {
	log   *slog.Logger
	level slog.Level
	src   string
}

func (l pahoLogger) Println(v ...any) {
	if l.log.Enabled(context.Background(), l.level) {
		l.log.Log(context.Background(), l.level, strings.TrimSuffix(fmt.Sprintln(v...), "\n"), "src", l.src)
	}
}

func (l pahoLogger) Printf(format string, v ...any) {
	if l.log.Enabled(context.Background(), l.level) {
		l.log.Log(context.Background(), l.level, strings.TrimSuffix(fmt.Sprintf(format, v...), "\n"), "src", l.src)
	}
}
