package modbus

import "fmt"

// Modbus exception codes (Modbus application protocol v1.1b3, 7).
const (
	ExIllegalFunction byte = 0x01
	ExIllegalAddress  byte = 0x02
	ExIllegalValue    byte = 0x03
	ExDeviceFailure   byte = 0x04
	ExAcknowledge     byte = 0x05
	ExDeviceBusy      byte = 0x06
	ExMemoryParity    byte = 0x08
	ExGatewayPath     byte = 0x0A
	ExGatewayTarget   byte = 0x0B
)

var exceptionNames = map[byte]string{
	ExIllegalFunction: "illegal function",
	ExIllegalAddress:  "illegal data address",
	ExIllegalValue:    "illegal data value",
	ExDeviceFailure:   "server device failure",
	ExAcknowledge:     "acknowledge",
	ExDeviceBusy:      "server device busy",
	ExMemoryParity:    "memory parity error",
	ExGatewayPath:     "gateway path unavailable",
	ExGatewayTarget:   "gateway target device failed to respond",
}

// ExceptionName names a Modbus exception code as the specification does,
// or "unknown exception" for a code it does not define.
func ExceptionName(code byte) string {
	if n, ok := exceptionNames[code]; ok {
		return n
	}
	return "unknown exception"
}

// ExceptionError is a device's exception response to a request of
// function Func. errors.Is(err, ErrException) holds for it.
type ExceptionError struct {
	Func byte // the request's function code
	Code byte // the exception code
}

func (e *ExceptionError) Error() string {
	return fmt.Sprintf("modbus: function 0x%02x: %s (0x%02x)", e.Func, ExceptionName(e.Code), e.Code)
}

// Unwrap returns ErrException.
func (e *ExceptionError) Unwrap() error { return ErrException }
