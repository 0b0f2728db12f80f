package promtext

import (
	"bytes"
	"compress/gzip"
	"net/http"
	"strings"
	"sync"
)

// Collector writes its samples into a scrape.
type Collector interface {
	Collect(w *Writer)
}

// CollectorFunc is a function as a Collector.
type CollectorFunc func(w *Writer)

// Collect calls f.
func (f CollectorFunc) Collect(w *Writer) { f(w) }

// ContentType is the exposition's media type.
const ContentType = "text/plain; version=0.0.4; charset=utf-8"

// Handler serves the collectors' samples as the text exposition, gzipped
// when the scraper accepts it (Prometheus does). A scrape whose collectors
// reported errors (Writer.Err) is still served with what they wrote;
// onError, if not nil, is told of the errors.
func Handler(onError func(error), cs ...Collector) http.Handler {
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		w := NewWriter()
		for _, c := range cs {
			c.Collect(w)
		}
		if err := w.Err(); err != nil && onError != nil {
			onError(err)
		}
		buf := bufs.Get().(*bytes.Buffer)
		defer bufs.Put(buf)
		buf.Reset()
		h := rw.Header()
		h.Set("Content-Type", ContentType)
		if acceptsGzip(r.Header.Get("Accept-Encoding")) {
			h.Set("Content-Encoding", "gzip")
			h.Add("Vary", "Accept-Encoding")
			zw := gzips.Get().(*gzip.Writer)
			defer gzips.Put(zw)
			zw.Reset(buf)
			_, _ = w.WriteTo(zw) // a bytes.Buffer does not fail
			_ = zw.Close()
		} else {
			_, _ = w.WriteTo(buf)
		}
		_, _ = rw.Write(buf.Bytes()) // a scraper gone away: nothing to tell
	})
}

var (
	bufs  = sync.Pool{New: func() any { return new(bytes.Buffer) }}
	gzips = sync.Pool{New: func() any { return gzip.NewWriter(nil) }}
)

// acceptsGzip reports whether an Accept-Encoding header takes gzip (and
// does not refuse it with q=0).
func acceptsGzip(h string) bool {
	for part := range strings.SplitSeq(h, ",") {
		name, params, _ := strings.Cut(strings.TrimSpace(part), ";")
		if !strings.EqualFold(strings.TrimSpace(name), "gzip") {
			continue
		}
		q := strings.ReplaceAll(params, " ", "")
		return q != "q=0" && q != "q=0.0" && q != "q=0.00" && q != "q=0.000"
	}
	return false
}
