package fwjob

// WithCrash returns c calling f at each named crash point of a step
// ("begin.reset", "chunk.written", "install.verify").
func WithCrash(c Config, f func(point string)) Config {
	c.crash = f
	return c
}

// WithBootCrash returns c calling f at each named crash point of Boot
// ("boot.armed", "boot.health").
func WithBootCrash(c BootConfig, f func(point string)) BootConfig {
	c.crash = f
	return c
}
