package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/eclipse/paho.golang/autopaho"
	"github.com/eclipse/paho.golang/paho"
	"go.etcd.io/bbolt"
	"golang.org/x/sys/unix"
)

// bareWrite is what a bare responder makes durable before it replies.
type bareWrite int32

const (
	// bareNoWrite replies at once.
	bareNoWrite bareWrite = iota
	// bareBolt commits one bbolt Update that puts a 16-byte mark (token,
	// seq) under the worker's key, with bbolt's default fsync: what a
	// device's shim commits for an accepted command, without the decode,
	// the admit rule and the apply.
	bareBolt
	// bareDatasync writes the 16-byte mark at offset 0 of a file of its own
	// (pwrite) and fdatasyncs it: the cheapest durable write there is.
	bareDatasync
	// bareBoltBoth is bareBolt at the responder, and the same commit at the
	// requester before it publishes: the shape of the agent's path, whose
	// outbox commits the command before it sends it.
	bareBoltBoth
)

// bareMarks is the bucket of the bare responders' bbolt files.
var bareMarks = []byte("marks")

// bareStore is one responder's durable state: a bbolt file and a raw file,
// both written only on that responder's paho delivery goroutine.
type bareStore struct {
	mu  sync.Mutex // the requester's store is written by every worker
	db  *bbolt.DB
	f   *os.File
	seq uint64
	buf [16]byte
}

func openBareStore(dir string, r int) (*bareStore, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	db, err := bbolt.Open(filepath.Join(dir, fmt.Sprintf("bare-rsp-%d.db", r)), 0o600, &bbolt.Options{Timeout: time.Second})
	if err != nil {
		return nil, fmt.Errorf("bare responder %d: %w", r, err)
	}
	s := &bareStore{db: db}
	if err = db.Update(func(tx *bbolt.Tx) error {
		_, err := tx.CreateBucketIfNotExists(bareMarks)
		return err
	}); err == nil {
		// The raw file has its 16 bytes from the start, so that each
		// fdatasync writes data and no size.
		s.f, err = os.OpenFile(filepath.Join(dir, fmt.Sprintf("bare-rsp-%d.mark", r)), os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	}
	if err == nil {
		_, err = s.f.WriteAt(s.buf[:], 0)
	}
	if err == nil {
		err = s.f.Sync()
	}
	if err != nil {
		s.close()
		return nil, fmt.Errorf("bare responder %d: %w", r, err)
	}
	return s, nil
}

// write makes the next mark durable for worker as how says.
func (s *bareStore) write(how bareWrite, worker string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq++
	binary.BigEndian.PutUint64(s.buf[:8], 1<<10)
	binary.BigEndian.PutUint64(s.buf[8:], s.seq)
	switch how {
	case bareBolt, bareBoltBoth:
		return s.db.Update(func(tx *bbolt.Tx) error {
			return tx.Bucket(bareMarks).Put([]byte(worker), s.buf[:])
		})
	case bareDatasync:
		if _, err := s.f.WriteAt(s.buf[:], 0); err != nil {
			return err
		}
		return unix.Fdatasync(int(s.f.Fd()))
	}
	return nil
}

func (s *bareStore) close() {
	if s.f != nil {
		_ = s.f.Close()
	}
	_ = s.db.Close()
}

// bareEcho is the bare paho baseline: autopaho clients (no edgefence
// code) on the same broker. The requester publishes at QoS 1 and waits for
// the PUBACK; a responder's handler receives it (1 hop) and, for the
// request→reply paths, makes a mark durable as write says (nothing, a bbolt
// commit or an fdatasync) and then publishes the reply at QoS 1 from inside
// the handler, as the device simulator commits and publishes its ack; the
// requester's handler receives the reply (2 hops). Worker i's requests go to
// responder i mod len(rsp), as device i's commands go to fleet i mod fleets.
type bareEcho struct {
	env, ack []byte
	req      *autopaho.ConnectionManager
	rsp      []*autopaho.ConnectionManager
	stores   []*bareStore    // per responder
	reqStore *bareStore      // the requester's, for bareBoltBoth
	write    atomic.Int32    // a bareWrite
	hop      chan time.Time  // 1-hop receptions
	replies  []chan struct{} // per worker
	cancel   context.CancelFunc

	mu  sync.Mutex
	err error // a responder's first failed write
}

const (
	bareOneTopic = "bare/one"
	bareReq      = "bare/req/" // + responder + "/" + worker
	bareRep      = "bare/rep/" // + worker
)

// newBareEcho connects the requester and responders bare responders on
// brokerURL, keeping the responders' files under dir.
func newBareEcho(ctx context.Context, brokerURL, name, dir string, workers, responders int, env, ack []byte) (b *bareEcho, err error) {
	u, err := url.Parse(brokerURL)
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithCancel(context.Background())
	b = &bareEcho{env: env, ack: ack, hop: make(chan time.Time, 1), cancel: cancel}
	defer func() {
		if err != nil {
			b.close()
		}
	}()
	for range workers {
		b.replies = append(b.replies, make(chan struct{}, 1))
	}
	connect := func(id string, onMsg func(paho.PublishReceived) (bool, error)) (*autopaho.ConnectionManager, error) {
		cfg := autopaho.ClientConfig{
			ServerUrls:                    []*url.URL{u},
			KeepAlive:                     30,
			CleanStartOnInitialConnection: true,
			ConnectTimeout:                5 * time.Second,
			ClientConfig: paho.ClientConfig{
				ClientID:          id,
				OnPublishReceived: []func(paho.PublishReceived) (bool, error){onMsg},
			},
		}
		cm, err := autopaho.NewConnection(cctx, cfg)
		if err != nil {
			return nil, err
		}
		if err := awaitCtx(ctx, 10*time.Second, cm.AwaitConnection); err != nil {
			return nil, err
		}
		return cm, nil
	}
	if b.reqStore, err = openBareStore(filepath.Join(dir, "req"), 0); err != nil {
		return nil, err
	}
	for r := range max(responders, 1) {
		st, err := openBareStore(dir, r)
		if err != nil {
			return nil, err
		}
		b.stores = append(b.stores, st)
		var cm *autopaho.ConnectionManager
		cm, err = connect(fmt.Sprintf("bench-bare-rsp-%s-%d", name, r), func(pr paho.PublishReceived) (bool, error) {
			return b.onRequest(cm, st, pr)
		})
		if err != nil {
			return nil, err
		}
		b.rsp = append(b.rsp, cm)
		filters := []string{fmt.Sprintf("%s%d/+", bareReq, r)}
		if r == 0 {
			filters = append(filters, bareOneTopic)
		}
		if err = bareSubscribe(ctx, cm, filters...); err != nil {
			return nil, err
		}
	}
	if b.req, err = connect("bench-bare-req-"+name, b.onReply); err != nil {
		return nil, err
	}
	if err = bareSubscribe(ctx, b.req, bareRep+"+"); err != nil {
		return nil, err
	}
	return b, nil
}

func bareSubscribe(ctx context.Context, cm *autopaho.ConnectionManager, filters ...string) error {
	s := &paho.Subscribe{}
	for _, f := range filters {
		s.Subscriptions = append(s.Subscriptions, paho.SubscribeOptions{Topic: f, QoS: 1})
	}
	_, err := cm.Subscribe(ctx, s)
	return err
}

func (b *bareEcho) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, cm := range append([]*autopaho.ConnectionManager{b.req}, b.rsp...) {
		if cm != nil {
			_ = cm.Disconnect(ctx)
		}
	}
	b.cancel()
	for _, s := range b.stores {
		s.close()
	}
	if b.reqStore != nil {
		b.reqStore.close()
	}
}

func (b *bareEcho) onRequest(cm *autopaho.ConnectionManager, st *bareStore, pr paho.PublishReceived) (bool, error) {
	p := pr.Packet
	if p.Topic == bareOneTopic {
		b.hop <- time.Now()
		return true, nil
	}
	worker := p.Topic[strings.LastIndexByte(p.Topic, '/')+1:]
	if err := st.write(bareWrite(b.write.Load()), worker); err != nil {
		b.mu.Lock()
		if b.err == nil {
			b.err = fmt.Errorf("bare responder's write: %w", err)
		}
		b.mu.Unlock()
		return true, nil // no reply: the requester reports b.err
	}
	var corr []byte
	if p.Properties != nil {
		corr = p.Properties.CorrelationData
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, _ = cm.Publish(ctx, &paho.Publish{QoS: 1, Topic: bareRep + worker, Payload: b.ack,
		Properties: &paho.PublishProperties{CorrelationData: corr}})
	return true, nil
}

func (b *bareEcho) onReply(pr paho.PublishReceived) (bool, error) {
	i, err := strconv.Atoi(strings.TrimPrefix(pr.Packet.Topic, bareRep))
	if err == nil && i >= 0 && i < len(b.replies) {
		select {
		case b.replies[i] <- struct{}{}:
		default:
		}
	}
	return true, nil
}

var corrData = []byte(strings.Repeat("0123456789abcdef", 2))

// oneHop is transport/mqtt's BenchmarkRoundTrip: from the start of Publish
// to the subscriber's handler, each publish also waiting for its PUBACK.
func (b *bareEcho) oneHop(ctx context.Context, _ int) (time.Duration, error) {
	start := time.Now()
	if _, err := b.req.Publish(ctx, &paho.Publish{QoS: 1, Topic: bareOneTopic, Payload: b.env,
		Properties: &paho.PublishProperties{CorrelationData: corrData, ResponseTopic: bareRep + "0"}}); err != nil {
		return 0, err
	}
	select {
	case t := <-b.hop:
		return t.Sub(start), nil
	case <-time.After(10 * time.Second):
		return 0, errors.New("no delivery within 10s")
	}
}

// echo is request→reply: from the start of Publish until the requester has
// the reply in hand (as agent.Send has the ack), the responder writing as
// b.write says.
func (b *bareEcho) echo(ctx context.Context, i int) (time.Duration, error) {
	is := strconv.Itoa(i)
	topic := fmt.Sprintf("%s%d/%d", bareReq, i%len(b.rsp), i)
	start := time.Now()
	if bareWrite(b.write.Load()) == bareBoltBoth {
		if err := b.reqStore.write(bareBolt, is); err != nil {
			return 0, fmt.Errorf("bare requester's write: %w", err)
		}
	}
	if _, err := b.req.Publish(ctx, &paho.Publish{QoS: 1, Topic: topic, Payload: b.env,
		Properties: &paho.PublishProperties{CorrelationData: corrData, ResponseTopic: bareRep + is}}); err != nil {
		return 0, err
	}
	select {
	case <-b.replies[i]:
		return time.Since(start), nil
	case <-time.After(10 * time.Second):
		b.mu.Lock()
		defer b.mu.Unlock()
		return 0, errors.Join(errors.New("no reply within 10s"), b.err)
	}
}
