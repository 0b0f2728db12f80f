package daemon

import (
	"context"
	"fmt"

	"github.com/edgefence/edgefence/agent/images"
	"github.com/edgefence/edgefence/agent/jobs"
)

// openImages opens the firmware image cache of the jobs section
// (<state_dir>/images by default), or returns nil with jobs off.
func (d *Daemon) openImages() error {
	jc := d.cfg.Jobs
	if !jc.On() {
		return nil
	}
	// A cache smaller than the default bound of one image bounds its
	// images instead (a gateway with little disk): the largest image it
	// can hold is the whole cache.
	maxBytes := uint64(jc.CacheMaxBytes)
	c, err := images.Open(jc.CacheDir, images.Options{MaxBytes: maxBytes, MaxImage: min(maxBytes, images.DefaultMaxImage),
		FetchTimeout: jc.FetchTimeout, Logger: d.log.With("component", "images")})
	if err != nil {
		return fmt.Errorf("jobs.cache_dir %s: %w", jc.CacheDir, err)
	}
	d.images = c
	return nil
}

// cacheImages serves the runner's images from the cache (jobs.Images).
func cacheImages(c *images.Cache) jobs.Images {
	return jobs.ImagesFunc(func(ctx context.Context, ref jobs.ImageRef) (jobs.Image, error) {
		sum, err := ref.Hash()
		if err != nil {
			return nil, err
		}
		im, err := c.Get(ctx, images.Ref{SHA256: sum, Size: ref.Size, URL: ref.URL})
		if err != nil {
			return nil, err // not a typed nil in the interface
		}
		return im, nil
	})
}
