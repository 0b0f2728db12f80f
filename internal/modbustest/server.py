"""A Modbus slave for edgefence's tests: pymodbus 3.0.0 (Debian's
python3-pymodbus), run by /usr/bin/python3 with one JSON argument:

  {"rtu": PATH, "baud": 19200, "parity": "E", "stop_bits": 1}  or  {"tcp": PORT}
  "units": [7, 9]                        the unit ids it answers (others: silence)
  "hr": N, "ir": N, "co": N, "di": N     block sizes, each from address 0

and, for fault tests, optionally:

  "write_log": FILE    every write the datastore applies, appended as one JSON
                       line {"pid", "unit", "table", "addr", "values"}, flushed
                       before the answer goes out
  "answer_as": {"7": 8}  answers to unit 7 carry unit id 8 (the request is
                       served as unit 7's: a foreign unit answering)
  "busy": N            the first N write requests are answered exception 0x06
                       (slave device busy) and not applied
  "stall": FILE        while FILE exists, the answer to a write waits (the
                       write is applied first): a slave to kill mid-transaction

On a pty the parity is ignored (see serve).

Initial values: holding and input register i of unit u is u*256 + i%256;
discrete input i is (u+i)%2; coils are 0. It prints "ready PORT" on stdout
once it serves (PORT is the bound TCP port, 0 on a serial line), then
serves until killed.
"""
import asyncio
import json
import logging
import os
import sys
import time

from pymodbus.datastore import (ModbusSequentialDataBlock, ModbusServerContext,
                                ModbusSlaveContext)
from pymodbus.pdu import ModbusExceptions
from pymodbus.server.async_io import (ModbusConnectedRequestHandler,
                                      ModbusSerialServer,
                                      ModbusSingleRequestHandler,
                                      ModbusTcpServer)
from pymodbus.transaction import ModbusRtuFramer, ModbusSocketFramer

WRITES = (0x05, 0x06, 0x0F, 0x10)
TABLES = {"h": "holding", "c": "coil", "i": "input", "d": "discrete"}


class LoggedSlave(ModbusSlaveContext):
    """A slave context that appends every write it applies to a file."""

    def __init__(self, unit, log, **kwargs):
        super().__init__(**kwargs)
        self.unit, self.log = unit, log

    def setValues(self, fc_as_hex, address, values):
        super().setValues(fc_as_hex, address, values)
        if self.log is None:
            return
        line = {"pid": os.getpid(), "unit": self.unit, "table": TABLES[self.decode(fc_as_hex)],
                "addr": address, "values": [int(v) for v in values]}
        self.log.write(json.dumps(line) + "\n")
        self.log.flush()


def slave(unit, spec, log):
    regs = [(unit * 256 + i % 256) & 0xFFFF for i in range(spec.get("hr", 100))]
    inputs = [(unit * 256 + i % 256) & 0xFFFF for i in range(spec.get("ir", 100))]
    return LoggedSlave(
        unit, log,
        hr=ModbusSequentialDataBlock(0, regs),
        ir=ModbusSequentialDataBlock(0, inputs),
        co=ModbusSequentialDataBlock(0, [0] * spec.get("co", 100)),
        di=ModbusSequentialDataBlock(0, [(unit + i) % 2 for i in range(spec.get("di", 100))]),
        zero_mode=True,  # request address 0 is block address 0
    )


def busy_handler(base, spec):
    """A request handler that answers the first spec["busy"] writes busy."""
    left = [spec.get("busy", 0)]

    class Handler(base):
        def execute(self, request, *addr):
            if request.function_code in WRITES and left[0] > 0:
                left[0] -= 1
                response = request.doException(ModbusExceptions.SlaveBusy)
                response.transaction_id, response.unit_id = request.transaction_id, request.unit_id
                self.send(response, *addr)
                return
            super().execute(request, *addr)
    return Handler


def manipulator(spec):
    """The answers' faults: another unit id (answer_as), a stall (stall)."""
    answer_as = {int(k): v for k, v in spec.get("answer_as", {}).items()}
    stall = spec.get("stall")

    def manipulate(response):
        if stall and response.function_code in WRITES:
            while os.path.exists(stall):
                time.sleep(0.005)
        response.unit_id = answer_as.get(response.unit_id, response.unit_id)
        return response, False
    return manipulate


async def serve(spec):
    log = open(spec["write_log"], "a", encoding="utf-8") if spec.get("write_log") else None
    context = ModbusServerContext(
        slaves={u: slave(u, spec, log) for u in spec["units"]}, single=False)
    faults = {"response_manipulator": manipulator(spec)}
    if "rtu" in spec:
        parity = spec.get("parity", "N")
        if parity != "N" and os.path.realpath(spec["rtu"]).startswith("/dev/pts/"):
            # A pty has no parity bit: Linux clears PARENB on it, and glibc's
            # tcsetattr, seeing PARENB not stick, fails with EINVAL, so
            # pyserial cannot open a pty with parity. Nothing is lost: a pty
            # carries bytes, not bits.
            print("pty %s: parity %s not settable, serving with N" % (spec["rtu"], parity),
                  file=sys.stderr, flush=True)
            parity = "N"
        server = ModbusSerialServer(
            context, framer=ModbusRtuFramer, port=spec["rtu"],
            baudrate=spec.get("baud", 19200), parity=parity,
            stopbits=spec.get("stop_bits", 1), bytesize=8, timeout=0.05,
            ignore_missing_slaves=True,
            handler=busy_handler(ModbusSingleRequestHandler, spec), **faults)
        await server.start()
        print("ready 0", flush=True)
        await server.serve_forever()
        return
    server = ModbusTcpServer(
        context, framer=ModbusSocketFramer, address=("127.0.0.1", spec["tcp"]),
        ignore_missing_slaves=True,
        handler=busy_handler(ModbusConnectedRequestHandler, spec),
        allow_reuse_address=True, **faults)  # a restart binds the same port at once
    task = asyncio.create_task(server.serve_forever())
    await asyncio.wait([task, server.serving], return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        task.result()  # serve_forever failed (e.g. the port is taken): raise it
        sys.exit("server stopped before serving")
    print("ready %d" % server.server.sockets[0].getsockname()[1], flush=True)
    await task


if __name__ == "__main__":
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    asyncio.run(serve(json.loads(sys.argv[1])))
