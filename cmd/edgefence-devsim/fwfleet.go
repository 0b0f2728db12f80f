package main

import (
	"context"
	"log/slog"
	"time"

	"github.com/edgefence/edgefence/devices/sim"
	"github.com/edgefence/edgefence/transport/mqtt"
)

// runFirmwareFleet runs the firmware devices ids in this process
// (--firmware --in-process, sim.FirmwareFleet) until ctx ends. It logs
// msg=ready once every device has booted and reported once, with the
// startup time and the process's RSS.
func runFirmwareFleet(ctx context.Context, log *slog.Logger, f devsimFlags, ids []string, creds mqtt.Config) int {
	a, err := f.deviceAuth(ids)
	if err != nil {
		log.Error("start", "err", err)
		return 1
	}
	start := time.Now()
	fleet, err := sim.StartFirmwareFleet(sim.FirmwareFleetConfig{Devices: ids, Dir: *f.dir, Signers: a.signers,
		HistoryPath: *f.histPath, HistorySource: *f.histSrc, RestartDelay: *f.fw.restartDelay,
		Device: sim.FirmwareConfig{Broker: *f.broker, Prefix: *f.prefix, Window: *f.fw.window, Tries: uint8(*f.fw.tries),
			Security: *f.fw.security, Keys: a.keys, Root: a.root, Logger: log, MQTT: creds}})
	if err != nil {
		log.Error("start", "err", err)
		return 1
	}
	code := 0
	if err := fleet.AwaitReady(ctx); err == nil {
		log.Info("ready", "devices", len(ids), "firmware", true, "in_process", true, "broker", *f.broker,
			"prefix", *f.prefix, "dir", *f.dir, "startup", time.Since(start).Round(time.Millisecond), "rss_kib", rssKiB())
		<-ctx.Done()
	} else if ctx.Err() == nil {
		log.Error("start", "err", err)
		code = 1
	}
	log.Info("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := fleet.Close(sctx); err != nil {
		log.Error("shutdown", "err", err)
		return 1
	}
	st := fleet.Stats()
	log.Info("stopped", "devices", len(ids), "accepted", st.Accepted, "duplicate", st.Duplicate, "stale", st.Stale,
		"invalid", st.Invalid, "reboots", st.Reboots, "power_losses", st.PowerLosses, "restarts", st.Restarts,
		"rss_kib", rssKiB(), "peak_rss_kib", peakRSSKiB())
	return code
}
