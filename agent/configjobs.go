package agent

import (
	"path/filepath"
	"time"
)

// Defaults of the jobs section (agent/images' own defaults).
const (
	DefaultJobsCacheMaxBytes int64 = 2 << 30
	DefaultJobsFetchTimeout        = 30 * time.Minute
	// DefaultJobsWindow is jobs.window's default (jobs.DefaultWindow).
	DefaultJobsWindow = 16
	// JobsCacheDir is the image cache's directory under state_dir.
	JobsCacheDir = "images"
)

// JobsConfig configures the firmware job runner (agent/jobs, README
// "Firmware jobs"): the agent drives the firmware jobs in etcd of the
// devices it holds, serving their images from a content-addressed cache.
type JobsConfig struct {
	// Enabled turns it on; default true. The agent then watches
	// <etcd.prefix>/jobs/ and /rollouts/ and reads its devices' state
	// reports.
	Enabled *bool `yaml:"enabled"`
	// CacheDir is the image cache's directory; default
	// <state_dir>/images.
	CacheDir string `yaml:"cache_dir"`
	// CacheMaxBytes bounds the cache's images in all; default 2 GiB.
	CacheMaxBytes int64 `yaml:"cache_max_bytes"`
	// FetchTimeout bounds one image fetch (file or HTTP(S) URL); default
	// 30m.
	FetchTimeout time.Duration `yaml:"fetch_timeout"`
	// Window is how many fw.chunk commands of a download the runner keeps
	// issued (stored in the outbox) ahead of the device's acks, 1 to 32;
	// default 4. The device still gets them one at a time, in order.
	Window int `yaml:"window"`
}

// On reports whether the runner is on (Enabled, default true).
func (j JobsConfig) On() bool { return j.Enabled == nil || *j.Enabled }

// applyDefaults fills in the jobs section; the cache goes under stateDir.
func (j *JobsConfig) applyDefaults(stateDir string) {
	if j.Enabled == nil {
		on := true
		j.Enabled = &on
	}
	orDefault(&j.CacheDir, filepath.Join(stateDir, JobsCacheDir))
	orDefault(&j.CacheMaxBytes, DefaultJobsCacheMaxBytes)
	orDefault(&j.FetchTimeout, DefaultJobsFetchTimeout)
	orDefault(&j.Window, DefaultJobsWindow)
}
