package main

import (
	"bufio"
	"io"
	"strings"
	"time"
)

// traceLine is one event of a QEMU log: its time and its words after the time.
type traceLine struct {
	at     time.Time
	fields []string
}

// eachTraceLine calls fn with each line of r that begins with a time in [from, to) (zero: no
// bound) and has at least minFields words, the time included; fn's error ends the scan.
func eachTraceLine(r io.Reader, from, to time.Time, minFields int, fn func(at time.Time, fields []string, line string) error) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < minFields {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, f[0])
		if err != nil || (!from.IsZero() && at.Before(from)) || (!to.IsZero() && !at.Before(to)) {
			continue
		}
		if err := fn(at, f, sc.Text()); err != nil {
			return err
		}
	}
	return sc.Err()
}

func readTraceLines(r io.Reader, from, to time.Time) ([]traceLine, error) {
	var lines []traceLine
	err := eachTraceLine(r, from, to, 2, func(at time.Time, f []string, _ string) error {
		lines = append(lines, traceLine{at, f[1:]})
		return nil
	})
	return lines, err
}
