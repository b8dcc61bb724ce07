package driver

import (
	"bytes"
	"encoding/csv"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/kiln-compiler/kiln/alloc"
	"github.com/kiln-compiler/kiln/progress"
)

func init() {
	addCommand(&command{
		name:    "alloc",
		usage:   "kiln alloc --capacity N IN.csv [-o OUT.csv] [--timeout S]",
		summary: "solve a static allocation problem (id,lower,upper,size -> offset); --capacity 0 minimises",
		flags: func(fs *flag.FlagSet) func(*env, []string) error {
			capacity := fs.Int64("capacity", 0, "the memory available; 0 minimises the arena")
			out := fs.String("o", "-", "output file (- for standard output)")
			var timeout secondsFlag // 0: 60 s fitting a capacity, 10 s minimising
			fs.Var(&timeout, "timeout", "time limit of the search: seconds (30) or a duration (90s, 2m); default 60 with --capacity, 10 minimising")
			return func(e *env, args []string) error {
				if len(args) != 1 {
					return usageError{"want exactly one .csv file (or - for standard input)"}
				}
				if *capacity < 0 {
					return usageError{"--capacity must not be negative"}
				}
				if timeout == 0 {
					timeout = secondsFlag(10 * time.Second)
					if *capacity > 0 {
						timeout = secondsFlag(time.Minute)
					}
				}
				var data []byte
				var err error
				if args[0] == "-" {
					data, err = io.ReadAll(e.stdin)
				} else {
					e.files.Read(args[0])
					data, err = os.ReadFile(args[0])
				}
				if err != nil {
					return fmt.Errorf("kiln: cannot read input: %v", unwrapPathError(err))
				}
				name := args[0]
				if name == "-" {
					name = "<stdin>"
				}
				p, header, records, err := readAllocCSV(name, data)
				if err != nil {
					return err
				}
				var sol *alloc.Solution
				prog := progress.For(e.terminal)
				prog.Step("alloc: packing %d buffers (at most %s)", len(p.Buffers), time.Duration(timeout))
				defer prog.Done()
				if *capacity > 0 {
					deadline := time.Now().Add(time.Duration(timeout))
					sol = alloc.GreedyWithin(p, true, deadline)
					if f := alloc.GreedyWithin(p, false, deadline); f.Size < sol.Size {
						sol = f
					}
					if sol.Size > *capacity && time.Until(deadline) > 0 {
						prog.Step("alloc: searching for a packing within %d bytes (until %s)", *capacity, deadline.Format("15:04:05"))
						sol = alloc.Search(p, alloc.SearchOptions{Capacity: *capacity, Timeout: time.Until(deadline), Initial: sol})
					}
					if sol.Size < 0 && sol.Optimal {
						return fmt.Errorf("kiln: no packing within capacity %d exists (the search was exhaustive; the max-live lower bound is %d)", *capacity, alloc.MaxLive(p))
					}
					if sol.Size < 0 || sol.Size > *capacity {
						return fmt.Errorf("kiln: no packing within capacity %d found in %s (the max-live lower bound is %d)", *capacity, time.Duration(timeout), alloc.MaxLive(p))
					}
				} else {
					sol = alloc.Best(p, time.Duration(timeout))
				}
				if err := alloc.Check(p, sol, *capacity); err != nil {
					return fmt.Errorf("kiln: internal error: %v", err)
				}
				var b bytes.Buffer
				w := csv.NewWriter(&b)
				w.Write(append(header, "offset"))
				for i, rec := range records {
					w.Write(append(rec, strconv.FormatInt(sol.Offsets[i], 10)))
				}
				w.Flush()
				optimal := ""
				if sol.Optimal {
					optimal = ", proven optimal"
				}
				fmt.Fprintf(e.stderr, "kiln alloc: %d buffers, arena %d bytes (max-live bound %d), %s%s\n", len(p.Buffers), sol.Size, alloc.MaxLive(p), sol.Algo, optimal)
				return writeOutput(e, *out, b.Bytes())
			}
		},
	})
}

// secondsFlag is a flag holding a duration, given as a number of seconds or
// in Go's duration syntax.
type secondsFlag time.Duration

func (s *secondsFlag) String() string { return time.Duration(*s).String() }

func (s *secondsFlag) Set(v string) error {
	if f, err := strconv.ParseFloat(v, 64); err == nil {
		if !(f > 0 && f <= 1e9) { // NaN too
			return fmt.Errorf("%s seconds is out of range", v)
		}
		*s = secondsFlag(f * float64(time.Second))
		return nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return fmt.Errorf("want seconds (30) or a positive duration (90s, 2m)")
	}
	*s = secondsFlag(d)
	return nil
}

// maxArenaBytes bounds the sum of a problem's sizes, so that no offset
// plus size (nor an alignment rounding) overflows int64.
const maxArenaBytes = 1 << 62

// allocColumns are the columns kiln alloc reads, found by their names in
// the header row.
var allocColumns = []string{"id", "lower", "upper", "size"}

// readAllocCSV reads buffers from a CSV file whose header row names the
// columns id, lower, upper and size (in any order; no other column), and
// returns them with the header and rows as read (the output repeats
// them). Each buffer is live on [lower, upper). Errors name the line.
func readAllocCSV(name string, data []byte) (*alloc.Problem, []string, [][]string, error) {
	r := csv.NewReader(bytes.NewReader(data))
	r.FieldsPerRecord = -1
	r.TrimLeadingSpace = true
	header, err := r.Read()
	if err != nil {
		return nil, nil, nil, fmt.Errorf("%s:1: error: no header row (want id,lower,upper,size)", name)
	}
	col := map[string]int{}
	for i := range header {
		header[i] = strings.TrimSpace(header[i])
		h := strings.ToLower(header[i])
		if _, dup := col[h]; dup {
			return nil, nil, nil, fmt.Errorf("%s:1: error: column %q appears twice in the header", name, header[i])
		}
		known := false
		for _, c := range allocColumns {
			known = known || c == h
		}
		if !known {
			if _, err := strconv.ParseInt(h, 10, 64); err == nil {
				return nil, nil, nil, fmt.Errorf("%s:1: error: the first row is data, not a header: kiln alloc needs a header naming id,lower,upper,size", name)
			}
			return nil, nil, nil, fmt.Errorf("%s:1: error: unknown column %q (the columns are id,lower,upper,size)", name, header[i])
		}
		col[h] = i
	}
	for _, c := range allocColumns {
		if _, ok := col[c]; !ok {
			return nil, nil, nil, fmt.Errorf("%s:1: error: the header has no column %q (want id,lower,upper,size)", name, c)
		}
	}
	p := &alloc.Problem{}
	var records [][]string
	seen := map[int]int{}
	total := int64(0)
	for {
		line, _ := r.FieldPos(0)
		rec, err := r.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, nil, nil, fmt.Errorf("%s: error: %v", name, err)
		}
		line, _ = r.FieldPos(0)
		if len(rec) == 1 && strings.TrimSpace(rec[0]) == "" {
			continue
		}
		if len(rec) != len(header) {
			return nil, nil, nil, fmt.Errorf("%s:%d: error: want %d fields (as the header), got %d", name, line, len(header), len(rec))
		}
		var v [4]int64
		for i, c := range allocColumns {
			v[i], err = strconv.ParseInt(strings.TrimSpace(rec[col[c]]), 10, 64)
			if err != nil {
				return nil, nil, nil, fmt.Errorf("%s:%d: error: %s %q is not an integer", name, line, c, rec[col[c]])
			}
		}
		switch {
		case v[3] < 0:
			return nil, nil, nil, fmt.Errorf("%s:%d: error: size %d is negative", name, line, v[3])
		case v[2] <= v[1]:
			return nil, nil, nil, fmt.Errorf("%s:%d: error: upper %d must be greater than lower %d", name, line, v[2], v[1])
		}
		if prev, dup := seen[int(v[0])]; dup {
			return nil, nil, nil, fmt.Errorf("%s:%d: error: id %d repeats the id on line %d", name, line, v[0], prev)
		}
		seen[int(v[0])] = line
		if total += v[3]; total > maxArenaBytes || total < 0 {
			return nil, nil, nil, fmt.Errorf("%s:%d: error: the sizes add up to more than %d bytes, the largest arena kiln alloc packs", name, line, int64(maxArenaBytes))
		}
		p.Buffers = append(p.Buffers, alloc.Buffer{ID: int(v[0]), Lower: v[1], Upper: v[2], Size: v[3]})
		for j := range rec {
			rec[j] = strings.TrimSpace(rec[j])
		}
		records = append(records, rec)
	}
	return p, header, records, nil
}
