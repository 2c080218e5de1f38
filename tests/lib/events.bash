# A job's record as the tests read it: events.jsonl of the jobs under ./logs (one job per test
# folder, or its restarts' rounds), and the trainer's last reported accuracy.
#
#   events                 every event line
#   ev_field EVENT FIELD   the value of FIELD in the events named EVENT, one line per event
#   wait_event EVENT [COUNT] [SECONDS]   until COUNT (1) such events are written, at most
#                          SECONDS (60); else prints the events and fails
#   unix_of TIME           an event's "time" as seconds since the epoch
#   final_acc FILE         the last "test-acc" the trainer printed in FILE

events() { cat logs/*/events.jsonl; }
ev_field() { events | grep "\"event\": \"$1\"" | grep -o "\"$2\": \(\"[^\"]*\|[^,}]*\)" | sed 's/^[^:]*: "\{0,1\}//; s/"$//'; }
unix_of() { date -d "$1" +%s.%N; }
final_acc() { grep -o 'test-acc [0-9.]*' "$1" | tail -n1 | cut -d' ' -f2; }

wait_event() { # event [count] [seconds]
  for _ in $(seq $((${3:-60} * 10))); do
    [ "$(events 2>/dev/null | grep -c "\"event\": \"$1\"")" -ge "${2:-1}" ] && return 0
    sleep 0.1
  done
  echo "no '$1' event in time:"; events; return 1
}
