package daemon

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/agent/bridge"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
	"github.com/edgefence/edgefence/fence/history"
	"github.com/edgefence/edgefence/transport/modbus"
	"github.com/edgefence/edgefence/transport/modbus/profile"
	"github.com/edgefence/edgefence/transport/mqtt"
	"github.com/edgefence/edgefence/transport/serial"
)

// bridgeDevices returns the devices this gateway is home for — on serial
// lines, MQTT topics and Modbus buses — with their ports validated (errors
// name the config field), and the Modbus buses with their devices'
// profiles loaded.
func bridgeDevices(cfg *agent.Config, log *slog.Logger) ([]bridge.Device, []bridge.Bus, error) {
	var out []bridge.Device
	var profiles map[string]*profile.Profile
	for i, d := range cfg.Devices {
		if d.Fence != agent.FenceGateway || d.Home != cfg.Gateway {
			continue
		}
		off := d.Auth == agent.AuthOff
		switch {
		case d.MQTTTopic != "":
			out = append(out, bridge.Device{ID: d.ID, Topic: d.MQTTTopic, AuthOff: off})
			continue
		case d.Modbus != nil:
			if profiles == nil {
				var err error
				if profiles, err = cfg.ModbusProfiles(); err != nil {
					return nil, nil, err
				}
			}
			u := &bridge.ModbusUnit{Bus: d.Modbus.Bus, Unit: byte(d.Modbus.Unit)}
			if d.Modbus.Profile != "" {
				u.Profile = profiles[d.Modbus.Profile]
			}
			out = append(out, bridge.Device{ID: d.ID, Modbus: u, AuthOff: off})
			continue
		case d.Serial == nil:
			return nil, nil, fmt.Errorf("%w: devices[%d]: a gateway-fenced device needs serial, mqtt_topic or modbus on its home gateway", agent.ErrConfig, i)
		}
		s := d.Serial
		pc := serial.PortConfig{Path: s.Port, Baud: s.Baud, DataBits: s.DataBits, Parity: s.Parity, StopBits: s.StopBits, ReadTimeout: s.ReadTimeout}
		if err := pc.Validate(); err != nil {
			return nil, nil, fmt.Errorf("%w: devices[%d].serial: %w", agent.ErrConfig, i, err)
		}
		out = append(out, bridge.Device{ID: d.ID, Port: pc, AuthOff: off})
	}
	return out, modbusBuses(cfg, log), nil
}

// modbusBuses returns the config's Modbus buses as the bridge opens them.
func modbusBuses(cfg *agent.Config, log *slog.Logger) []bridge.Bus {
	var out []bridge.Bus
	for _, c := range cfg.Modbus.Buses {
		b := bridge.Bus{BusConfig: modbus.BusConfig{Name: c.Name, TCP: c.TCP, Timeout: c.Timeout, Logger: log.With("component", "modbus", "bus", c.Name)},
			PollUtilisation: c.PollUtilisation}
		if c.Retries != nil {
			b.Retries = *c.Retries
		}
		if c.RTU != nil {
			pc := c.RTU.PortConfig()
			b.RTU = &pc
		}
		out = append(out, b)
	}
	return out
}

// openBridge opens the fence table and prepares the bridge when this
// gateway is home for `fence: gateway` devices, verifying their commands
// against trust (nil: none). The returned func closes both; it is safe to
// call twice.
func openBridge(cfg *agent.Config, log *slog.Logger, o Options, trust *auth.Trust) (*bridge.Bridge, *fence.Table, func(), error) {
	devs, buses, err := bridgeDevices(cfg, log)
	if err != nil || len(devs) == 0 {
		return nil, nil, func() {}, err
	}
	// The table answers for its devices: its acks go out signed with the
	// gateway's key, when it has one (I7).
	signer, err := gatewaySigner(cfg.Auth)
	if err != nil {
		return nil, nil, nil, err
	}
	if err := os.MkdirAll(cfg.StateDir, 0o750); err != nil {
		return nil, nil, nil, fmt.Errorf("state dir: %w", err)
	}
	root, err := resetRoot(cfg.Auth) // the operator's fence resets (reset.go)
	if err != nil {
		return nil, nil, nil, err
	}
	// The history of the fence point: the table records its accepts
	// (before each commit), the bridge its refusals and what the devices
	// applied, under one source.
	var hist *history.Writer
	if o.BridgeHistoryPath != "" {
		if hist, err = history.Create(o.BridgeHistoryPath, "table:"+cfg.Gateway); err != nil {
			return nil, nil, nil, fmt.Errorf("bridge history: %w", err)
		}
	}
	// The table the bridge admits through: the gateway's, or in a test or
	// demo build with the no-fence-table failpoint, none.
	var tbl *fence.Table
	var admit bridge.Table
	if o.UnsafeNoFenceTable {
		admit, err = bridge.NoTable(hist)
	} else if tbl, err = fence.OpenTable(filepath.Join(cfg.StateDir, fence.TableFile), &fence.TableOptions{History: hist}); err == nil {
		admit = tbl
	}
	if err != nil {
		hist.Close()
		return nil, nil, nil, err
	}
	bcfg := bridge.Config{Table: admit, Topics: mqtt.Topics{Prefix: cfg.MQTT.Prefix}, Devices: devs, Buses: buses,
		Logger: log.With("component", "bridge"), History: hist, Root: root, Signer: signer}
	if trust != nil {
		bcfg.Keys = trust // a nil *Trust in the interface would not be nil
	}
	if tbl != nil {
		bcfg.TrustDB = tbl.Bolt() // trust updates the table learns, durable in its file (with Keys an *auth.Trust)
	}
	br, err := bridge.New(bcfg)
	if err != nil {
		hist.Close()
		if tbl != nil {
			tbl.Close()
		}
		return nil, nil, nil, err
	}
	var once sync.Once
	return br, tbl, func() {
		once.Do(func() {
			br.Close()
			hist.Close()
			if tbl != nil {
				tbl.Close()
			}
		})
	}, nil
}
