/// The 256 words of transfer codes (docs/PROTOCOL.md §9.1): word i stands for byte i.
///
/// Common, concrete English nouns of 3 to 7 letters that are easy to say, spell and type, with
/// no two alike; sorted, so a word's index is found by binary search.
enum WordList {
    static let words: [String] = [
        "acid", "acorn", "agent", "alarm", "album", "alley", "amber", "angle", "ankle", "apple",
        "armor", "arrow", "aspen", "atlas", "audio", "autumn", "bacon", "badge", "bagel", "baker",
        "bamboo", "banjo", "barn", "basil", "basket", "beach", "beaver", "bench", "berry", "bison",
        "blanket", "bottle", "breeze", "brick", "bridge", "broom", "bucket", "bunny", "butter", "button",
        "cabin", "cactus", "camel", "candle", "canoe", "canyon", "carpet", "carrot", "castle", "cedar",
        "cello", "cherry", "chess", "cider", "circle", "citrus", "cliff", "clock", "cloud", "clover",
        "cobra", "cocoa", "comet", "copper", "coral", "cotton", "coyote", "crayon", "cricket", "crystal",
        "daisy", "dancer", "delta", "denim", "desert", "donkey", "dragon", "drum", "duck", "dune",
        "eagle", "earth", "echo", "elbow", "elm", "ember", "engine", "falcon", "feather", "fern",
        "fiddle", "fig", "finch", "flag", "flute", "forest", "fossil", "fox", "frog", "galaxy",
        "garden", "garlic", "gecko", "ginger", "glacier", "globe", "goat", "gold", "granite", "grape",
        "gravel", "guitar", "gull", "hammer", "harbor", "harp", "hazel", "helmet", "heron", "hippo",
        "honey", "hotel", "husky", "igloo", "indigo", "iris", "island", "ivory", "jacket", "jaguar",
        "jelly", "jigsaw", "jungle", "kayak", "kettle", "kiwi", "koala", "ladder", "lagoon", "lantern",
        "laptop", "lemon", "leopard", "lily", "lizard", "lobster", "lotus", "magnet", "mango", "maple",
        "marble", "meadow", "melon", "meteor", "mirror", "mitten", "monkey", "moose", "mosaic", "muffin",
        "napkin", "nectar", "needle", "nest", "noodle", "nutmeg", "oasis", "ocean", "olive", "onion",
        "orange", "orbit", "orchid", "otter", "owl", "oyster", "paddle", "palace", "panda", "paper",
        "parrot", "peach", "peanut", "pebble", "pepper", "piano", "pickle", "pigeon", "pillow", "pine",
        "pirate", "planet", "plum", "pocket", "pony", "poppy", "potato", "pumpkin", "puzzle", "quartz",
        "quilt", "rabbit", "radio", "radish", "rainbow", "raven", "ribbon", "river", "robot", "rocket",
        "rose", "ruby", "saddle", "salmon", "sandal", "saturn", "scarf", "shadow", "shell", "shovel",
        "silver", "skate", "sloth", "snail", "spider", "spoon", "statue", "stone", "sugar", "summer",
        "sunset", "swan", "table", "tiger", "timber", "tomato", "topaz", "tulip", "tunnel", "turtle",
        "valley", "velvet", "violin", "wagon", "walnut", "walrus", "whale", "willow", "window", "winter",
        "wizard", "wolf", "yacht", "yogurt", "zebra", "zipper",
    ]

    /// The index of a word (lowercase), or nil.
    static func index(of word: String) -> Int? {
        var low = 0, high = words.count
        while low < high {
            let middle = (low + high) / 2
            if words[middle] == word { return middle }
            if words[middle] < word { low = middle + 1 } else { high = middle }
        }
        return nil
    }
}
