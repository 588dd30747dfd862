// A mysql-databus consumer written only from seed 001's structs (and go-mysql's schema.Table
// and mysql.Position, which they embed), with Go's encoding/json: it reads Kafka messages (or
// dump lines) and rebuilds the table the way the seed's Do() applies RowsEvents.
//
// Input on stdin, one message per line: hex(key) SP hex(value); a dump line has an empty
// key. Output on stdout, one JSON object: the rebuilt rows (each value base64-decoded, then
// hex-encoded so that any bytes survive JSON; null stays null), the QueryEvents' statements
// and the number of RowsEvents.
package main

import (
	"bufio"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
)

// mysql.Position
type Position struct {
	Name string
	Pos  uint32
}

type KafkaKey struct {
	Pos    Position
	Action string
}

// schema.TableColumn, schema.Index, schema.Table
type TableColumn struct {
	Name       string
	Type       int
	RawType    string
	IsAuto     bool
	EnumValues []string
	SetValues  []string
}

type Index struct {
	Name        string
	Columns     []string
	Cardinality []uint64
}

type Table struct {
	Schema string
	Name   string

	Columns   []TableColumn
	Indexes   []*Index
	PKColumns []int
}

type RowsEvent struct {
	Table  *Table
	Action string
	Rows   [][]interface{}
}

type QueryEvent struct {
	Table  *Table
	Action string
	Query  []byte
}

type output struct {
	Rows       [][]*string
	Statements []string
	Events     int
}

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
	os.Exit(1)
}

func value(v interface{}) *string {
	if v == nil {
		return nil
	}
	s, ok := v.(string)
	if !ok {
		fail("a column value is %T, not a base64 string", v)
	}
	raw, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		fail("a column value is not base64: %v", err)
	}
	text := hex.EncodeToString(raw) // exact bytes, whatever they hold
	return &text
}

func keyOf(table *Table, row []*string) string {
	if len(row) != len(table.Columns) {
		fail("a row of %d values for %d columns", len(row), len(table.Columns))
	}
	columns := table.PKColumns
	if len(columns) == 0 {
		for i := range row {
			columns = append(columns, i)
		}
	}
	parts := []string{}
	for _, i := range columns {
		if row[i] == nil {
			parts = append(parts, "\x00null")
		} else {
			parts = append(parts, *row[i])
		}
	}
	return strings.Join(parts, "\x01")
}

func main() {
	rows := map[string][]*string{}
	out := output{Statements: []string{}}
	scanner := bufio.NewScanner(os.Stdin)
	scanner.Buffer(make([]byte, 1<<20), 1<<30)
	for scanner.Scan() {
		parts := strings.SplitN(scanner.Text(), " ", 2)
		if len(parts) != 2 {
			fail("a line without a key and a value")
		}
		keyBytes, err1 := hex.DecodeString(parts[0])
		valueBytes, err2 := hex.DecodeString(parts[1])
		if err1 != nil || err2 != nil {
			fail("bad hex")
		}
		action := "DML" // a dump line
		if len(keyBytes) > 0 {
			var key KafkaKey
			if err := json.Unmarshal(keyBytes, &key); err != nil {
				fail("KafkaKey: %v", err)
			}
			action = key.Action
		}
		switch action {
		case "DDL":
			var e QueryEvent
			if err := json.Unmarshal(valueBytes, &e); err != nil {
				fail("QueryEvent: %v", err)
			}
			if e.Table == nil {
				fail("a QueryEvent without a Table")
			}
			_ = e.Table.Schema // the SDK dereferences it
			switch e.Action { // the DDL actions of mysql-databus's docs
			case "alter", "create", "drop", "truncate":
			default:
				fail("QueryEvent.Action %q is not one of mysql-databus's", e.Action)
			}
			out.Statements = append(out.Statements, string(e.Query))
		case "DML":
			var e RowsEvent
			if err := json.Unmarshal(valueBytes, &e); err != nil {
				fail("RowsEvent: %v", err)
			}
			if e.Table == nil {
				fail("a RowsEvent without a Table")
			}
			out.Events++
			for i := 0; i < len(e.Rows); i++ {
				row := make([]*string, len(e.Rows[i]))
				for j, v := range e.Rows[i] {
					row[j] = value(v)
				}
				switch e.Action {
				case "insert":
					rows[keyOf(e.Table, row)] = row
				case "update":
					if i+1 >= len(e.Rows) {
						fail("an update with an odd number of rows")
					}
					after := make([]*string, len(e.Rows[i+1]))
					for j, v := range e.Rows[i+1] {
						after[j] = value(v)
					}
					delete(rows, keyOf(e.Table, row))
					rows[keyOf(e.Table, after)] = after
					i++
				case "delete":
					delete(rows, keyOf(e.Table, row))
				default:
					fail("RowsEvent.Action %q", e.Action)
				}
			}
		default:
			fail("KafkaKey.Action %q is neither DML nor DDL", action)
		}
	}
	if err := scanner.Err(); err != nil {
		fail("reading: %v", err)
	}
	keys := make([]string, 0, len(rows))
	for k := range rows {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		out.Rows = append(out.Rows, rows[k])
	}
	encoded, err := json.Marshal(out)
	if err != nil {
		fail("output: %v", err)
	}
	fmt.Println(string(encoded))
}
